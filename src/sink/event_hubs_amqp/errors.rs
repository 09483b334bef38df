//! Event Hubs client errors as the sink reports them: definite or transient by the
//! client's own error types, and their text without the client's layered labels.

use super::SinkError;

/// An Event Hubs client error as a [`SinkError`]: definite for the AMQP conditions
/// that resending cannot change (not authorized, no such event hub, too large, a
/// refused argument, not allowed or implemented) and for a batch size the link
/// refuses, transient for the rest (timeouts, connections, the service busy).
///
/// Decided by the client's own error types, found along the error's source chain
/// (`EventHubsError` → `AmqpError` → the described AMQP error the service sent),
/// never by the text.
///
/// The client's text is kept without a `source`: each of its layers prints the one
/// below it in its own text behind a label, so the plain text (see [`plain`]) says
/// it all once.
pub(super) fn delivery_error<E>(e: E) -> SinkError
where
    E: std::error::Error + 'static,
{
    if is_definite(&e) {
        SinkError::definite(e.to_string())
    } else {
        SinkError::transient(e.to_string())
    }
}

/// The client's error text without the labels its layers add ("AMQP Error: AMQP
/// Error: Azure Core Error: Connection refused" is "Connection refused").
pub(super) fn plain(error: &dyn std::fmt::Display) -> String {
    let mut text = error.to_string();
    loop {
        let trimmed = ["AMQP Error: ", "Azure Core Error: ", "Event Hubs Error: "]
            .iter()
            .find_map(|label| text.strip_prefix(label).map(str::to_owned));
        match trimmed {
            Some(rest) => text = rest,
            None => return text,
        }
    }
}

/// Whether anything along `error`'s source chain is a condition resending cannot
/// change.
pub(super) fn is_definite(error: &(dyn std::error::Error + 'static)) -> bool {
    use azure_core_amqp::error::{AmqpErrorCondition as C, AmqpErrorKind};
    use azure_messaging_eventhubs::error::{ErrorKind, EventHubsError};
    let definite_condition = |condition: &C| {
        matches!(
            condition,
            C::UnauthorizedAccess
                | C::NotFound
                | C::LinkPayloadSizeExceeded
                | C::ArgumentError
                | C::ArgumentOutOfRangeError
                | C::NotAllowed
                | C::NotImplemented
        )
    };
    let mut next = Some(error);
    while let Some(error) = next {
        if let Some(e) = error.downcast_ref::<EventHubsError>() {
            match &e.kind {
                ErrorKind::SendRejected(Some(described))
                    if definite_condition(&described.condition) =>
                {
                    return true;
                }
                ErrorKind::InvalidBatchSize { .. } => return true,
                _ => {}
            }
        }
        if let Some(e) = error.downcast_ref::<azure_core_amqp::AmqpError>() {
            match e.kind() {
                AmqpErrorKind::AmqpDescribedError(described)
                    if definite_condition(&described.condition) =>
                {
                    return true;
                }
                AmqpErrorKind::ManagementStatusCode(status, _)
                    if matches!(u16::from(*status), 401 | 403 | 404) =>
                {
                    return true;
                }
                _ => {}
            }
        }
        next = error.source();
    }
    false
}
