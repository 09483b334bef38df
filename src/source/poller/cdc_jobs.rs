//! CDC's jobs as the stream sees them, read now and then for the metrics: the
//! capture job's latest log scan session (how far behind the log the job is, how
//! many transactions its last scan took), every time, and the cleanup job's
//! retention (how long the stream may fall behind before changes it has not
//! delivered are purged), every [`RETENTION_EVERY`] times. Watching them never
//! fails a poll: a read that fails keeps the last answer, and a login that may not
//! read them is told once.

use std::time::Duration;

use tokio::time::Instant;

use crate::error::Chain;
use crate::source::initial_load::cleanup_retention;
use crate::source::{Fact, FactReads, LogScan};

/// The retention is read again after this many reads of the log scan session: it
/// changes only when a DBA changes it.
pub(super) const RETENTION_EVERY: u32 = 10;

/// What the cleanup job keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retention {
    /// Not read (yet), or this login may not read `msdb.dbo.cdc_jobs`.
    Unknown,
    /// No cleanup job: changes are never purged.
    Forever,
    Kept(Duration),
}

/// CDC's jobs as last read: the capture job's last log scan session and the
/// cleanup job's retention.
#[derive(Debug)]
pub(super) struct CdcJobsWatch {
    /// When it was last asked (answered or not).
    asked_at: Option<Instant>,
    scan: Option<LogScan>,
    retention: Retention,
    /// Reads of the log scan session since the retention was last asked.
    since_retention: u32,
    /// Whether the log said why the session cannot be read.
    said_unknown: bool,
}

impl Default for CdcJobsWatch {
    fn default() -> Self {
        CdcJobsWatch {
            asked_at: None,
            scan: None,
            retention: Retention::Unknown,
            // The first refresh asks.
            since_retention: RETENTION_EVERY,
            said_unknown: false,
        }
    }
}

impl CdcJobsWatch {
    /// Asks `source` for the session when `every` has passed since the last ask.
    pub(super) async fn refresh<S: FactReads>(&mut self, source: &mut S, every: Duration) {
        if self.asked_at.is_some_and(|at| at.elapsed() < every) {
            return;
        }
        self.asked_at = Some(Instant::now());
        if self.since_retention >= RETENTION_EVERY {
            self.since_retention = 0;
            match source.server_facts().await {
                Ok(facts) => {
                    self.retention = match (&facts.jobs, cleanup_retention(&facts)) {
                        (Fact::Unknown(_), _) => Retention::Unknown,
                        (Fact::Known(_), None) => Retention::Forever,
                        (Fact::Known(_), Some(kept)) => Retention::Kept(kept),
                    };
                }
                Err(e) => {
                    tracing::debug!(error = %Chain(&e), "the cleanup job's retention was not read; the last answer stands");
                }
            }
        }
        self.since_retention += 1;
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

    /// The cleanup job's retention, as last read.
    pub(super) fn retention(&self) -> Retention {
        self.retention
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
        jobs: Fact<Vec<crate::source::CdcJob>>,
        facts_asked: usize,
    }

    impl FactReads for Scripted {
        async fn server_facts(&mut self) -> Result<ServerFacts, SourceError> {
            self.facts_asked += 1;
            let mut facts = crate::source::synthetic::SyntheticSource::new(Default::default())
                .server_facts()
                .await?;
            facts.jobs = self.jobs.clone();
            Ok(facts)
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
            total_tran_count: None,
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
            jobs: Fact::Unknown("needs SELECT on msdb.dbo.cdc_jobs".into()),
            facts_asked: 0,
        };
        let every = Duration::from_secs(30);
        let mut watch = CdcJobsWatch::default();
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
        assert_eq!(watch.retention(), Retention::Unknown);
        assert_eq!(
            source.facts_asked, 1,
            "the retention is asked at the first read"
        );
    }

    /// The retention is read at the first refresh and every tenth after it: kept
    /// for so long, forever without a cleanup job, unknown when refused.
    #[tokio::test(start_paused = true)]
    async fn the_retention_is_read_first_and_every_tenth_time() {
        let mut source = Scripted {
            answers: (0..25).map(|_| Ok(Fact::Known(None))).collect(),
            asked: 0,
            jobs: Fact::Known(vec![
                crate::source::CdcJob::capture(crate::source::CaptureSettings::DEFAULT),
                crate::source::CdcJob::cleanup(4320),
            ]),
            facts_asked: 0,
        };
        let every = Duration::from_secs(30);
        let mut watch = CdcJobsWatch::default();
        watch.refresh(&mut source, every).await;
        assert_eq!(
            watch.retention(),
            Retention::Kept(Duration::from_secs(4320 * 60))
        );
        source.jobs = Fact::Known(vec![crate::source::CdcJob::capture(
            crate::source::CaptureSettings::DEFAULT,
        )]);
        for _ in 1..RETENTION_EVERY {
            tokio::time::advance(every).await;
            watch.refresh(&mut source, every).await;
        }
        assert_eq!(source.facts_asked, 1);
        assert!(
            matches!(watch.retention(), Retention::Kept(_)),
            "not asked again yet"
        );
        tokio::time::advance(every).await;
        watch.refresh(&mut source, every).await;
        assert_eq!(source.facts_asked, 2);
        assert_eq!(
            watch.retention(),
            Retention::Forever,
            "the cleanup job was dropped"
        );
    }
}
