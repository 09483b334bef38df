//! `mssql-ces snapshot`: asks a running stream to re-snapshot tables, through its
//! metrics server's admin endpoint (`metrics.admin`, `POST /snapshot/…`). Nothing
//! is written to the database, nor to the checkpoint by this process: the running
//! stream records the re-snapshot in its checkpoint.

use std::io::{Read as _, Write as _};
use std::time::Duration;

use crate::config::{AdminAccess, Config};

/// How long the stream may take to answer: it answers between two of its polls.
const ANSWER_WAIT: Duration = Duration::from_secs(60);

/// Why a re-snapshot could not be asked for.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotCommandError {
    #[error(
        "metrics.admin is \"off\" in this configuration: the running stream must serve the admin endpoint (set metrics.admin = \"loopback\" and metrics.listen, and restart it)"
    )]
    AdminOff,
    #[error(transparent)]
    Config(#[from] crate::setting::ConfigError),
    #[error(
        "{address}: no answer from the stream's metrics server (is it running with this configuration?)"
    )]
    Unreachable {
        address: String,
        #[source]
        cause: std::io::Error,
    },
}

/// The stream's answer to one table: whether it took it on, and what it said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub table: String,
    pub accepted: bool,
    pub text: String,
}

/// Asks the stream `config` runs for each of `tables` (`schema.table`), of
/// `database` only when named (with `source.databases`).
pub fn request(
    config: &Config,
    database: Option<&str>,
    tables: &[String],
) -> Result<Vec<Answer>, SnapshotCommandError> {
    if config.metrics.admin == AdminAccess::Off {
        return Err(SnapshotCommandError::AdminOff);
    }
    let Some(mut address) = config.metrics.listen_address()? else {
        return Err(SnapshotCommandError::AdminOff);
    };
    // Listening on every interface: this machine's loopback reaches it.
    if address.ip().is_unspecified() {
        address.set_ip(if address.is_ipv4() {
            std::net::Ipv4Addr::LOCALHOST.into()
        } else {
            std::net::Ipv6Addr::LOCALHOST.into()
        });
    }
    let mut answers = Vec::new();
    for table in tables {
        let path = match database {
            Some(d) => format!("/snapshot/{}/{}", encode(d), encode(table)),
            None => format!("/snapshot/{}", encode(table)),
        };
        let request =
            format!("POST {path} HTTP/1.0\r\nHost: localhost\r\nContent-Length: 0\r\n\r\n");
        let response = exchange(&address, &request, ANSWER_WAIT).map_err(|cause| {
            SnapshotCommandError::Unreachable {
                address: address.to_string(),
                cause,
            }
        })?;
        let accepted = response.split_whitespace().nth(1) == Some("200");
        let body = response.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        answers.push(Answer {
            table: table.clone(),
            accepted,
            text: body.trim_end().to_owned(),
        });
    }
    Ok(answers)
}

/// One HTTP/1.0 exchange: `request` written in one segment, the whole response read
/// (the server closes the connection).
pub fn exchange(
    address: &std::net::SocketAddr,
    request: &str,
    timeout: Duration,
) -> std::io::Result<String> {
    let mut stream = std::net::TcpStream::connect_timeout(address, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    stream.write_all(request.as_bytes())?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    Ok(response)
}

/// `text` as one path segment: unreserved characters as they are, the rest
/// percent-encoded (UTF-8).
fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_name_is_one_path_segment() {
        assert_eq!(encode("dbo.orders"), "dbo.orders");
        assert_eq!(encode("sales.Order Lines/2"), "sales.Order%20Lines%2F2");
        assert_eq!(encode("dbo.Straße"), "dbo.Stra%C3%9Fe");
    }
}
