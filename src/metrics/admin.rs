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
                let mut line = serde_json::to_value(&answer).unwrap_or_default();
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn served(admin: AdminAccess, metrics: Arc<super::super::Metrics>) -> Served {
        Served { metrics, admin }
    }

    fn loopback() -> SocketAddr {
        "127.0.0.1:50000".parse().unwrap()
    }

    #[tokio::test]
    async fn loopback_refuses_other_peers_and_no_stream_is_unavailable() {
        let metrics = Arc::new(super::super::Metrics::new(std::time::Duration::from_secs(
            60,
        )));
        let other: SocketAddr = "10.0.0.7:40000".parse().unwrap();
        let (status, _, body) = snapshot(
            &served(AdminAccess::Loopback, Arc::clone(&metrics)),
            other,
            None,
            "dbo.t",
        )
        .await;
        assert_eq!(status, StatusCode::FORBIDDEN);
        assert!(body.contains("10.0.0.7"), "{body}");
        // `any` lets it through, to find no stream running.
        let (status, _, body) = snapshot(
            &served(AdminAccess::Any, Arc::clone(&metrics)),
            other,
            None,
            "dbo.t",
        )
        .await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        let (status, _, _) = snapshot(
            &served(AdminAccess::Loopback, metrics),
            loopback(),
            None,
            "dbo.t",
        )
        .await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    }

    #[tokio::test]
    async fn the_pollers_answers_become_statuses() {
        use crate::source::poller::{SnapshotAccepted, SnapshotRefused};
        let metrics = Arc::new(super::super::Metrics::new(std::time::Duration::from_secs(
            60,
        )));
        let (handle, mut requests) = crate::source::poller::SnapshotHandle::channel_for_tests();
        metrics.set_snapshot_handle(Some(handle));
        // A poller that answers from a script.
        tokio::spawn(async move {
            let mut answers = vec![
                Ok(SnapshotAccepted {
                    table: "dbo.t".into(),
                    capture_instance: "dbo_t".into(),
                    at: crate::lsn::Lsn::from_parts(1, 2, 3),
                    new: true,
                    rows: 0,
                }),
                Err(SnapshotRefused::NoKey {
                    table: "dbo.heap".into(),
                }),
                Err(SnapshotRefused::NotStreamed {
                    table: "dbo.nope".into(),
                    streamed: "dbo.t, dbo.heap".into(),
                }),
            ]
            .into_iter();
            while let Some(request) = requests.recv().await {
                let _ = request.reply.send(answers.next().unwrap());
            }
        });
        let served = served(AdminAccess::Loopback, metrics);
        let (status, _, body) = snapshot(&served, loopback(), None, "dbo.t").await;
        assert_eq!(status, StatusCode::OK);
        let line: serde_json::Value = serde_json::from_str(body.trim()).unwrap();
        assert_eq!(line["at_lsn"], "00000001:00000002:0003");
        assert_eq!(line["new"], true);
        assert!(line.get("database").is_none(), "one stream: no database");
        let (status, _, body) = snapshot(&served, loopback(), None, "dbo.heap").await;
        assert_eq!(status, StatusCode::CONFLICT);
        assert!(body.contains("no key"), "{body}");
        let (status, _, body) = snapshot(&served, loopback(), None, "dbo.nope").await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(body.contains("dbo.t, dbo.heap"), "{body}");
    }
}
