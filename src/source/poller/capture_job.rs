//! The capture job as the stream sees it: its latest log scan session, read now and
//! then for the metrics (how far behind the log the job is, how many transactions
//! its last scan took). Watching it never fails a poll: a read that fails keeps the
//! last answer, and a login that may not read the session is told once.

use std::time::Duration;

use tokio::time::Instant;

use crate::error::Chain;
use crate::source::{Fact, FactReads, LogScan};

/// The capture job's last log scan session, as last read.
#[derive(Debug, Default)]
pub(super) struct CaptureJobWatch {
    /// When it was last asked (answered or not).
    asked_at: Option<Instant>,
    scan: Option<LogScan>,
    /// Whether the log said why it cannot be read.
    said_unknown: bool,
}

impl CaptureJobWatch {
    /// Asks `source` for the session when `every` has passed since the last ask.
    pub(super) async fn refresh<S: FactReads>(&mut self, source: &mut S, every: Duration) {
        if self.asked_at.is_some_and(|at| at.elapsed() < every) {
            return;
        }
        self.asked_at = Some(Instant::now());
        match source.log_scan().await {
            Ok(Fact::Known(scan)) => self.scan = scan,
            Ok(Fact::Unknown(why)) => {
                self.scan = None;
                if !std::mem::replace(&mut self.said_unknown, true) {
                    tracing::info!(
                        "the capture job's metrics are not available: {why} (the stream does not need them)"
                    );
                }
            }
            Err(e) => {
                tracing::debug!(error = %Chain(&e), "the capture job's last log scan was not read; the last answer stands");
            }
        }
    }

    /// The last session read, if any.
    pub(super) fn scan(&self) -> Option<&LogScan> {
        self.scan.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::{ServerFacts, SourceError};

    /// A source whose log scan answers are scripted, counting the asks.
    struct Scripted {
        answers: Vec<Result<Fact<Option<LogScan>>, SourceError>>,
        asked: usize,
    }

    impl FactReads for Scripted {
        async fn server_facts(&mut self) -> Result<ServerFacts, SourceError> {
            unreachable!("only the log scan is asked")
        }

        async fn log_scan(&mut self) -> Result<Fact<Option<LogScan>>, SourceError> {
            self.asked += 1;
            self.answers.remove(0)
        }
    }

    fn scan(latency_seconds: i64) -> LogScan {
        LogScan {
            start_time: chrono::NaiveDateTime::default(),
            end_time: None,
            latency_seconds,
            error_count: 0,
            tran_count: 500,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn it_asks_once_an_interval_keeps_the_last_answer_through_a_failure_and_forgets_it_when_refused()
     {
        let mut source = Scripted {
            answers: vec![
                Ok(Fact::Known(Some(scan(3)))),
                Err(SourceError::transient("the connection was reset")),
                Ok(Fact::Unknown("needs VIEW DATABASE STATE".into())),
                Ok(Fact::Unknown("needs VIEW DATABASE STATE".into())),
            ],
            asked: 0,
        };
        let every = Duration::from_secs(30);
        let mut watch = CaptureJobWatch::default();
        watch.refresh(&mut source, every).await;
        assert_eq!(watch.scan().map(|s| s.latency_seconds), Some(3));
        watch.refresh(&mut source, every).await;
        assert_eq!(source.asked, 1, "not again within the interval");
        tokio::time::advance(every).await;
        watch.refresh(&mut source, every).await;
        assert_eq!(source.asked, 2);
        assert_eq!(
            watch.scan().map(|s| s.latency_seconds),
            Some(3),
            "a failed read keeps the last answer"
        );
        tokio::time::advance(every).await;
        watch.refresh(&mut source, every).await;
        assert!(watch.scan().is_none(), "refused: nothing to show");
        assert!(watch.said_unknown);
    }
}
