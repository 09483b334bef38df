//! What every module's errors share: a cause kept as it was raised, and the one way
//! an error is shown to an operator, with every cause behind it.
//!
//! An error says what failed in this program's terms ("the connection to SQL Server
//! failed", "delivery failed: topic orders"); the driver's, client's or system's own
//! error stays behind it as its `source`, never copied into its text, so that a
//! chain shown in full says each thing once.

use std::error::Error;
use std::fmt;
use std::sync::Arc;

/// A lower layer's error (tiberius, rdkafka, I/O, the Event Hubs client), kept as the
/// `source` of ours. Shared, because one failure can be the answer to many waiters
/// (every message of a failed batch is told the same error).
pub type Cause = Arc<dyn Error + Send + Sync + 'static>;

/// Keeps `error` as a [`Cause`].
pub fn cause(error: impl Error + Send + Sync + 'static) -> Cause {
    Arc::new(error)
}

/// An error and its causes, outermost first, separated by `: `: how logs and the
/// command line show an error. A cause whose text the one before it already
/// includes is not repeated: some clients (rdkafka, the Azure SDK) print their
/// source in their own text and return it as the source too.
pub struct Chain<'a>(pub &'a (dyn Error + 'a));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut shown = self.0.to_string();
        f.write_str(&shown)?;
        let mut next = self.0.source();
        while let Some(error) = next {
            let text = error.to_string();
            if !shown.contains(&text) {
                write!(f, ": {text}")?;
                shown = text;
            }
            next = error.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] Middle);

    #[derive(Debug, thiserror::Error)]
    #[error("middle")]
    struct Middle(#[source] std::io::Error);

    #[test]
    fn a_chain_shows_each_cause_once_outermost_first() {
        let error = Outer(Middle(std::io::Error::other("disk full")));
        assert_eq!(Chain(&error).to_string(), "outer: middle: disk full");
        let alone = std::io::Error::other("alone");
        assert_eq!(Chain(&alone).to_string(), "alone");
    }

    /// As rdkafka's errors are: the source's text inside the error's own.
    #[derive(Debug, thiserror::Error)]
    #[error("Message production error: {0}")]
    struct Quoting(#[source] std::io::Error);

    #[test]
    fn a_cause_the_error_already_quotes_is_not_repeated() {
        let error = Outer(Middle(std::io::Error::other("x")));
        let quoting = Quoting(std::io::Error::other("Broker: Message size too large"));
        assert_eq!(
            Chain(&quoting).to_string(),
            "Message production error: Broker: Message size too large"
        );
        // Only a cause inside the text shown just before it is left out.
        assert_eq!(Chain(&error).to_string(), "outer: middle: x");
    }

    #[test]
    fn a_shared_cause_keeps_its_own_source() {
        let shared = cause(Middle(std::io::Error::other("reset")));
        assert_eq!(Chain(&*shared).to_string(), "middle: reset");
    }
}
