//! One exponential backoff for every retry loop: the source's polls, checkpoint
//! writes, planning the initial load and reopening an Event Hubs connection.

use std::time::Duration;

/// Waits that double from `first` up to `cap`; [`reset`](Backoff::reset) after a
/// success starts again from `first`.
///
/// Each wait is drawn from the upper half of its step (between half the step and
/// the step): loops that failed together — every database of a server when it
/// restarts, every member of a fleet when the brokers come back — then do not
/// retry in step. A wait is never longer than the step, so the bounds a caller
/// states (the cap) hold.
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    cap: Duration,
    next: Duration,
    /// The jitter's generator state; `None` for exact steps.
    jitter: Option<u64>,
}

impl Backoff {
    pub fn new(first: Duration, cap: Duration) -> Self {
        use std::hash::{BuildHasher, Hasher};
        // A seed that differs between loops and processes, without a dependency.
        let seed = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        Backoff {
            first,
            cap,
            next: first.min(cap),
            jitter: Some(seed),
        }
    }

    /// The steps themselves, without jitter (for tests that count on them).
    pub fn exact(first: Duration, cap: Duration) -> Self {
        Backoff {
            jitter: None,
            ..Backoff::new(first, cap)
        }
    }

    /// After a success: the next failure waits `first` again.
    pub fn reset(&mut self) {
        self.next = self.first.min(self.cap);
    }

    /// The wait before the next attempt.
    pub fn next_wait(&mut self) -> Duration {
        let step = self.next;
        self.next = (self.next * 2).min(self.cap);
        match &mut self.jitter {
            None => step,
            Some(state) => {
                let half = step / 2;
                let spread = (step - half).as_nanos() as u64;
                let drawn = if spread == 0 {
                    0
                } else {
                    splitmix64(state) % (spread + 1)
                };
                half + Duration::from_nanos(drawn)
            }
        }
    }
}

/// The next number of a splitmix64 sequence (a small, well-mixed generator).
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_to_the_cap_and_start_again_after_a_reset() {
        let mut b = Backoff::exact(Duration::from_millis(100), Duration::from_secs(30));
        let waits: Vec<u128> = (0..12).map(|_| b.next_wait().as_millis()).collect();
        assert_eq!(&waits[..4], &[100, 200, 400, 800]);
        assert_eq!(waits[8], 25_600);
        assert_eq!(waits[9], 30_000);
        assert_eq!(waits[11], 30_000);
        b.reset();
        assert_eq!(b.next_wait().as_millis(), 100);
        // A first wait above the cap is the cap.
        let mut capped = Backoff::exact(Duration::from_secs(60), Duration::from_secs(10));
        assert_eq!(capped.next_wait(), Duration::from_secs(10));
        capped.reset();
        assert_eq!(capped.next_wait(), Duration::from_secs(10));
    }

    #[test]
    fn jittered_waits_stay_in_the_upper_half_of_each_step_and_differ_between_loops() {
        let steps = [100u128, 200, 400, 800, 1_600, 3_200, 6_400, 10_000, 10_000];
        let run = || {
            let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(10));
            steps
                .iter()
                .map(|&step| {
                    let wait = b.next_wait().as_micros();
                    let step = step * 1_000;
                    assert!(step / 2 <= wait && wait <= step, "{wait} µs for {step}");
                    wait
                })
                .collect::<Vec<_>>()
        };
        let loops: Vec<Vec<u128>> = (0..8).map(|_| run()).collect();
        assert!(
            loops.iter().any(|l| l != &loops[0]),
            "eight loops retried in step: {loops:?}"
        );
        // Spread over the half-step, not bunched at one end.
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(1));
        let waits: Vec<u128> = (0..1_000).map(|_| b.next_wait().as_millis()).collect();
        let low = waits.iter().filter(|&&w| w < 750).count();
        assert!(
            (350..650).contains(&low),
            "{low} of 1000 in the lower quarter"
        );
        b.reset();
        assert!(b.next_wait() >= Duration::from_millis(500));
    }

    #[test]
    fn the_generator_is_splitmix64_and_both_ends_of_a_step_are_drawn() {
        // The reference sequence from seed 0 (Vigna's splitmix64.c).
        let mut state = 0u64;
        let first: Vec<u64> = (0..3).map(|_| splitmix64(&mut state)).collect();
        assert_eq!(
            first,
            [
                0xe220_a839_7b1d_cdaf,
                0x6e78_9e6a_a1b9_65f4,
                0x06c4_5d18_8009_454f
            ]
        );
        // A 2 ns step draws 1 ns or 2 ns: the step itself is reachable.
        let mut seen = std::collections::BTreeSet::new();
        let mut b = Backoff::new(Duration::from_nanos(2), Duration::from_nanos(2));
        for _ in 0..64 {
            seen.insert(b.next_wait().as_nanos());
        }
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), [1, 2]);
    }
}
