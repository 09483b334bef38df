//! The stop signals of one run, named by who gives them and who heeds them.

use tokio_util::sync::CancellationToken;

/// How the stages of a run tell each other to stop.
#[derive(Debug, Clone, Default)]
pub(super) struct Signals {
    /// The caller's stop (a signal, or an idle run caught up): the send loop stops
    /// between batches, and a batch begun finishes within the drain bound.
    pub(super) shutdown: CancellationToken,
    /// The acker failed (a checkpoint it could not write, a delivery that failed):
    /// the send loop stops at once.
    pub(super) acker_failed: CancellationToken,
    /// The drain deadline passed: the acker stops waiting for deliveries, and what
    /// is not delivered is abandoned (sent again on the next start).
    pub(super) abandon: CancellationToken,
}

impl Signals {
    /// The signals of a run that stops when `shutdown` is cancelled.
    pub(super) fn new(shutdown: CancellationToken) -> Self {
        Signals {
            shutdown,
            ..Signals::default()
        }
    }
}
