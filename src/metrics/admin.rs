//! The admin endpoint (`metrics.admin`): `POST /snapshot/<schema.table>` (every
//! running stream that reads such a table) and `POST /snapshot/<database>/<schema.table>`
//! (with `source.databases`, that database's stream). The answer is the poller's:
//! 200 and a JSON line per stream that took the re-snapshot on, 404 naming what the
//! streams read, 409 for a table they cannot re-snapshot, 503 when no stream runs,
//! 403 from a peer `metrics.admin = "loopback"` does not allow.

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, Path, State};
use axum::http::{StatusCode, header};

use super::{Page, Served};
use crate::config::AdminAccess;
use crate::source::poller::SnapshotRefused;

pub(super) async fn snapshot_table(
    State(served): State<Served>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(table): Path<String>,
) -> Page {
    snapshot(&served, peer, None, &table).await
}

pub(super) async fn snapshot_database_table(
    State(served): State<Served>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path((database, table)): Path<(String, String)>,
) -> Page {
    snapshot(&served, peer, Some(&database), &table).await
}

fn text(status: StatusCode, body: String) -> Page {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body + "\n",
    )
}

async fn snapshot(served: &Served, peer: SocketAddr, database: Option<&str>, table: &str) -> Page {
    if served.admin == AdminAccess::Loopback && !peer.ip().is_loopback() {
        tracing::warn!(%peer, "a re-snapshot request from another machine was refused (metrics.admin = \"loopback\")");
        return text(
            StatusCode::FORBIDDEN,
            format!(
                "refused: metrics.admin = \"loopback\" answers this machine only, and the request came from {}",
                peer.ip()
            ),
        );
    }
    let handles = served.metrics.snapshot_handles(database);
    if handles.is_empty() {
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            match database {
                Some(d) => {
                    format!("no stream of database {d} runs now: ask again while it is read")
                }
                None => {
                    "no stream runs now (waiting for the lease, or between restarts): ask again"
                        .to_owned()
                }
            },
        );
    }
    let mut accepted = Vec::new();
    let mut refused = Vec::new();
    for (name, handle) in handles {
        match handle.request(table).await {
            Ok(answer) => {
                let mut line = serde_json::json!({
                    "table": answer.table,
                    "capture_instance": answer.capture_instance,
                    "at_lsn": answer.at.to_string(),
                    "new": answer.new,
                    "rows": answer.rows,
                });
                if !name.is_empty() {
                    line["database"] = name.into();
                }
                accepted.push(line.to_string());
            }
            Err(why) => refused.push((name, why)),
        }
    }
    if !accepted.is_empty() {
        return (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/x-ndjson")],
            accepted.join("\n") + "\n",
        );
    }
    let status = if refused
        .iter()
        .all(|(_, why)| matches!(why, SnapshotRefused::NotStreamed { .. }))
    {
        StatusCode::NOT_FOUND
    } else {
        StatusCode::CONFLICT
    };
    let lines: Vec<String> = refused
        .iter()
        .map(|(name, why)| {
            if name.is_empty() {
                format!("refused: {why}")
            } else {
                format!("refused by database {name}: {why}")
            }
        })
        .collect();
    text(status, lines.join("\n"))
}
