//! A schema registry double: Confluent's REST API, as much as a producer and a
//! deserializer use, on a loopback port (a test double, not Confluent's server).
//!
//! - `POST /subjects/{subject}/versions` with `{"schema": "…"}`: the schema's id,
//!   one id per distinct schema text across subjects, as the registry gives them;
//!   422 (`error_code` 42201) for a schema that is not Avro; 409 (`error_code` 409)
//!   for a new schema under a subject marked incompatible, or — the registry's
//!   default compatibility, `BACKWARD` — for a new Avro schema that cannot read
//!   what the subject's latest version wrote (Avro's schema resolution: a field the
//!   latest lacks needs a default), no id given; 401 when basic authentication is
//!   required and missing or wrong. `set_compatibility_none` turns the check off
//!   for a subject, as `PUT /config/{subject}` with `NONE` does.
//! - `GET /schemas/ids/{id}` (query parameters ignored, as clients from 2.8 add
//!   `?subject=`): `{"schema": "…"}`; 404 (`error_code` 40403) for an unknown id.
//! - Anything else: 404 (`error_code` 404), which is what the Python client's newer
//!   subject lookup (`/associations/…`) expects of a registry without it.
//! - `set_down(true)`: every request answers 503 (`error_code` 50003).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine as _;

#[derive(Debug, Default)]
struct Registry {
    /// Schema texts; id = index + 1.
    schemas: Vec<String>,
    /// Subject → ids registered under it, in order.
    subjects: BTreeMap<String, Vec<u32>>,
    incompatible: BTreeSet<String>,
    /// Subjects whose compatibility is `NONE` (every other one is `BACKWARD`).
    unchecked: BTreeSet<String>,
    down: bool,
    /// `Authorization` header required, when set.
    auth: Option<String>,
    posts: u64,
}

/// The double; stops when dropped.
pub struct RegistryDouble {
    pub url: String,
    state: Arc<Mutex<Registry>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for RegistryDouble {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type Shared = Arc<Mutex<Registry>>;

fn error(status: StatusCode, code: i64, message: &str) -> Response {
    (
        status,
        [("Content-Type", "application/vnd.schemaregistry.v1+json")],
        serde_json::json!({"error_code": code, "message": message}).to_string(),
    )
        .into_response()
}

fn ok(body: serde_json::Value) -> Response {
    (
        StatusCode::OK,
        [("Content-Type", "application/vnd.schemaregistry.v1+json")],
        body.to_string(),
    )
        .into_response()
}

fn lock(state: &Shared) -> std::sync::MutexGuard<'_, Registry> {
    state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A failure shared by every route: down, or not authorized.
fn refused(registry: &Registry, headers: &HeaderMap) -> Option<Response> {
    if registry.down {
        return Some(error(
            StatusCode::SERVICE_UNAVAILABLE,
            50003,
            "Error while forwarding the request to the leader",
        ));
    }
    if let Some(expected) = &registry.auth {
        let given = headers.get("authorization").and_then(|v| v.to_str().ok());
        if given != Some(expected.as_str()) {
            return Some(error(StatusCode::UNAUTHORIZED, 401, "Unauthorized"));
        }
    }
    None
}

async fn register(
    State(state): State<Shared>,
    Path(subject): Path<String>,
    headers: HeaderMap,
    body: String,
) -> Response {
    let mut registry = lock(&state);
    registry.posts += 1;
    if let Some(response) = refused(&registry, &headers) {
        return response;
    }
    let request: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    let Some(schema) = request.get("schema").and_then(|s| s.as_str()) else {
        return error(
            StatusCode::UNPROCESSABLE_ENTITY,
            42201,
            "Either the input schema or one of its references is invalid",
        );
    };
    // Avro (the registry's default schema type) parsed as the registry parses it:
    // names are checked too (a `-` in a namespace is refused).
    if let Err(e) = apache_avro::Schema::parse_str(schema) {
        return error(
            StatusCode::UNPROCESSABLE_ENTITY,
            42201,
            &format!("Invalid schema: {e}"),
        );
    }
    let under = registry.subjects.get(&subject).cloned().unwrap_or_default();
    let known = registry
        .schemas
        .iter()
        .position(|s| s == schema)
        .map(|i| i as u32 + 1);
    if known.is_none_or(|id| !under.contains(&id)) && !under.is_empty() {
        let latest = under
            .last()
            .and_then(|id| registry.schemas.get(*id as usize - 1));
        let refusal = if registry.incompatible.contains(&subject) {
            Some(
                "Schema being registered is incompatible with an earlier schema for subject"
                    .to_owned(),
            )
        } else if registry.unchecked.contains(&subject) {
            None
        } else {
            latest.and_then(|latest| backward_refusal(latest, schema))
        };
        if let Some(message) = refusal {
            return error(StatusCode::CONFLICT, 409, &message);
        }
    }
    let id = match known {
        Some(id) => id,
        None => {
            registry.schemas.push(schema.to_owned());
            registry.schemas.len() as u32
        }
    };
    if !under.contains(&id) {
        registry.subjects.entry(subject).or_default().push(id);
    }
    ok(serde_json::json!({ "id": id }))
}

/// Why `new` cannot read data written with `latest` (`BACKWARD`), if it cannot.
fn backward_refusal(latest: &str, new: &str) -> Option<String> {
    let latest = apache_avro::Schema::parse_str(latest).ok()?;
    let new = apache_avro::Schema::parse_str(new).ok()?;
    // Avro's Java `SchemaCompatibility`, which the registry uses, wants every
    // branch of a union the writer wrote readable; the Rust crate calls a union
    // with one unreadable branch "partial".
    use apache_avro::schema_compatibility::{Compatibility, SchemaCompatibility};
    let why = match SchemaCompatibility::can_read(&latest, &new) {
        Ok(Compatibility::Full) => return None,
        Ok(Compatibility::Partial) => {
            "a branch of a union the latest version wrote cannot be read".to_owned()
        }
        Err(e) => e.to_string(),
    };
    Some(format!(
        "Schema being registered is incompatible with an earlier schema for subject: {why}"
    ))
}

async fn schema_by_id(
    State(state): State<Shared>,
    Path(id): Path<u32>,
    headers: HeaderMap,
) -> Response {
    let registry = lock(&state);
    if let Some(response) = refused(&registry, &headers) {
        return response;
    }
    match registry.schemas.get((id as usize).wrapping_sub(1)) {
        Some(schema) => ok(serde_json::json!({ "schema": schema })),
        None => error(StatusCode::NOT_FOUND, 40403, "Schema not found"),
    }
}

async fn subjects(State(state): State<Shared>, headers: HeaderMap) -> Response {
    let registry = lock(&state);
    if let Some(response) = refused(&registry, &headers) {
        return response;
    }
    ok(serde_json::json!(
        registry.subjects.keys().collect::<Vec<_>>()
    ))
}

impl RegistryDouble {
    pub async fn start() -> Self {
        let state: Shared = Arc::default();
        let app = axum::Router::new()
            .route("/subjects/{subject}/versions", post(register))
            .route("/schemas/ids/{id}", get(schema_by_id))
            .route("/subjects", get(subjects))
            .fallback(|| async { error(StatusCode::NOT_FOUND, 404, "HTTP 404 Not Found") })
            .with_state(Arc::clone(&state));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        RegistryDouble { url, state, task }
    }

    /// Requires basic authentication with `user` and `password`.
    pub fn require_auth(&self, user: &str, password: &str) {
        let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        lock(&self.state).auth = Some(format!("Basic {token}"));
    }

    /// Every request answers 503 while `down`.
    pub fn set_down(&self, down: bool) {
        lock(&self.state).down = down;
    }

    /// `subject`'s compatibility is `NONE`: any new schema is accepted.
    pub fn set_compatibility_none(&self, subject: &str) {
        lock(&self.state).unchecked.insert(subject.to_owned());
    }

    /// A second, different schema under `subject` is refused as incompatible.
    pub fn set_incompatible(&self, subject: &str) {
        lock(&self.state).incompatible.insert(subject.to_owned());
    }

    /// Registers `schema` under `subject` directly (as another producer did before).
    pub fn preload(&self, subject: &str, schema: &str) -> u32 {
        let mut registry = lock(&self.state);
        registry.schemas.push(schema.to_owned());
        let id = registry.schemas.len() as u32;
        registry
            .subjects
            .entry(subject.to_owned())
            .or_default()
            .push(id);
        id
    }

    /// Subjects and the ids registered under each.
    pub fn subjects(&self) -> BTreeMap<String, Vec<u32>> {
        lock(&self.state).subjects.clone()
    }

    /// The schema text of `id`.
    pub fn schema(&self, id: u32) -> Option<String> {
        lock(&self.state)
            .schemas
            .get((id as usize).wrapping_sub(1))
            .cloned()
    }

    /// Registration requests received (answered or not).
    pub fn posts(&self) -> u64 {
        lock(&self.state).posts
    }
}
