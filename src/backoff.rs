//! One exponential backoff for every retry loop: the source's polls, checkpoint
//! writes, planning the initial load and reopening an Event Hubs connection.

use std::time::Duration;

/// Waits that double from `first` up to `cap`; [`reset`](Backoff::reset) after a
/// success starts again from `first`.
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    cap: Duration,
    next: Duration,
}

impl Backoff {
    pub fn new(first: Duration, cap: Duration) -> Self {
        Backoff {
            first,
            cap,
            next: first.min(cap),
        }
    }

    /// After a success: the next failure waits `first` again.
    pub fn reset(&mut self) {
        self.next = self.first.min(self.cap);
    }

    /// The wait before the next attempt.
    pub fn next_wait(&mut self) -> Duration {
        let wait = self.next;
        self.next = (self.next * 2).min(self.cap);
        wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_to_the_cap_and_start_again_after_a_reset() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(30));
        let waits: Vec<u128> = (0..12).map(|_| b.next_wait().as_millis()).collect();
        assert_eq!(&waits[..4], &[100, 200, 400, 800]);
        assert_eq!(waits[8], 25_600);
        assert_eq!(waits[9], 30_000);
        assert_eq!(waits[11], 30_000);
        b.reset();
        assert_eq!(b.next_wait().as_millis(), 100);
        // A first wait above the cap is the cap.
        let mut capped = Backoff::new(Duration::from_secs(60), Duration::from_secs(10));
        assert_eq!(capped.next_wait(), Duration::from_secs(10));
        capped.reset();
        assert_eq!(capped.next_wait(), Duration::from_secs(10));
    }
}
