//! A **synthetic** change workload: deterministic, seeded, and not a database.
//!
//! Source kind `synthetic` writes generated transactions to a small database of its
//! own ([`database`]) on three tables (`dbo.customers`, `dbo.orders`, `sales.[order details]`) covering
//! most column types. Transaction `k` depends only on the seed and `k`, and the
//! database's LSN clock and commit times advance only with transactions, so a restarted
//! process sees exactly the same change history, LSNs and commit times: the basis of
//! demos, benchmarks and crash tests. Rows already read are dropped from memory.

// Tokio's clock, so that tests can pace the workload on simulated time.
use tokio::time::Instant;

use chrono::{FixedOffset, NaiveDate, Offset as _, TimeZone};
use uuid::Uuid;

pub mod bulk;
mod database;
pub mod server;

pub use database::{Statement, Transaction};

use crate::event::Value;
use crate::event::value::{Length, SqlType};
use crate::lsn::Lsn;
use crate::source::{
    CaptureDdl, CaptureInstance, Catalog, CdcReads, ChangeRow, DdlEvent, FactReads, MaxLsn, Probe,
    ProbeResult, RowKey, SourceClock, SourceError, TableCursor, TableReads,
};
use database::Database;

/// Settings of the synthetic workload.
#[derive(Debug, Clone, PartialEq)]
pub struct SyntheticConfig {
    /// The same seed gives the same change history.
    pub seed: u64,
    /// Transactions in all; `None` for an endless stream.
    pub transactions: Option<u64>,
    /// Transactions per second; `None` to make all of them available at once.
    pub rate_per_second: Option<f64>,
    /// Every this many transactions, one carries a large (300 KB) text value, so that
    /// segmentation is exercised; 0 for never.
    pub large_value_every: u64,
    /// Rows of `dbo.products`, a table that held them before CDC was enabled and that
    /// the workload never changes: what an initial load reads (0: no such table).
    /// Row `k` is generated when read, so the table may be of any size.
    pub existing_rows: u64,
    /// Every this many transactions, one also inserts into `dbo.attachments` a row
    /// whose text and binary values are over the 1 MiB CES keeps of a value (a 4-byte
    /// character straddling the cut), so that truncation is exercised; 0 for never
    /// (and no such table). The other tables get the same rows either way.
    pub oversized_value_every: u64,
}

impl Default for SyntheticConfig {
    fn default() -> Self {
        SyntheticConfig {
            seed: 1,
            transactions: Some(10_000),
            rate_per_second: None,
            large_value_every: 0,
            existing_rows: 0,
            oversized_value_every: 0,
        }
    }
}

/// SplitMix64: small, fast, and stable across versions (unlike a library RNG whose
/// stream may change), which the determinism promise needs.
#[derive(Debug, Clone)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }
}

/// Transactions generated per call at most: what the database holds unread, so an
/// unpaced stream's memory stays small (and its polls keep coming).
const GENERATED_PER_CALL: u64 = 1_000;

/// Customers, and orders, that the workload keeps at most (each order has up to a
/// few lines): the tables' size, whatever the stream's length.
const LIVE_ROWS: usize = 10_000;

const CUSTOMERS: &str = "dbo.customers";
const ORDERS: &str = "dbo.orders";
const LINES: &str = "sales.order details";
const PRODUCTS: &str = "products";
const ATTACHMENTS: &str = "dbo.attachments";

/// Row `id` (1-based) of `dbo.products`: a function of the seed and the id alone.
fn product(seed: u64, id: u64) -> Vec<Value> {
    let mut rng = SplitMix64(seed ^ id.wrapping_mul(0x2545_F491_4F6C_DD1D));
    let updated = NaiveDate::from_ymd_opt(2025, 1, 1)
        .and_then(|d| d.and_hms_milli_opt(0, 0, 0, 0))
        .unwrap_or_default()
        + chrono::Duration::milliseconds(rng.below(1 << 34) as i64);
    vec![
        Value::BigInt(i64::try_from(id).unwrap_or(i64::MAX)),
        Value::Text(format!("Product {id} · größe {}", rng.below(50))),
        Value::Decimal {
            unscaled: i128::from(rng.below(1_000_000)),
            scale: 2,
        },
        Value::Int(rng.below(10_000) as i32),
        Value::DateTime2 {
            value: updated,
            scale: 3,
        },
    ]
}

/// The workload's tables, CDC-enabled: customers, orders and order lines, and
/// `dbo.products` and `dbo.attachments` when the configuration asks for them.
fn create_tables(db: &mut Database, config: &SyntheticConfig) {
    use SqlType::*;
    db.create_captured_table(
        "dbo",
        "customers",
        &[
            ("id", Int),
            ("name", NVarChar(Length::Bounded(100))),
            ("email", VarChar(Length::Bounded(200))),
            ("balance", Money),
            ("created_at", DateTime2 { scale: 7 }),
            ("vip", Bit),
        ],
        1,
    );
    db.create_captured_table(
        "dbo",
        "orders",
        &[
            ("id", BigInt),
            ("customer_id", Int),
            (
                "total",
                Decimal {
                    precision: 18,
                    scale: 2,
                },
            ),
            ("status", TinyInt),
            ("note", NVarChar(Length::Max)),
            ("placed_at", DateTimeOffset { scale: 3 }),
            ("ref", UniqueIdentifier),
            ("weight", Float),
        ],
        1,
    );
    db.create_captured_table(
        "sales",
        "order details",
        &[
            ("order_id", BigInt),
            ("line", Int),
            ("sku", Char(Length::Bounded(10))),
            ("qty", SmallInt),
            (
                "price",
                Decimal {
                    precision: 10,
                    scale: 2,
                },
            ),
        ],
        2,
    );
    if config.existing_rows > 0 {
        // Its rows are generated when read (`read_table`), never held.
        db.create_captured_table(
            "dbo",
            PRODUCTS,
            &[
                ("id", BigInt),
                ("name", NVarChar(Length::Bounded(100))),
                (
                    "price",
                    Decimal {
                        precision: 10,
                        scale: 2,
                    },
                ),
                ("stock", Int),
                ("updated_at", DateTime2 { scale: 3 }),
            ],
            1,
        );
    }
    if config.oversized_value_every > 0 {
        db.create_captured_table(
            "dbo",
            "attachments",
            &[
                ("id", BigInt),
                ("name", NVarChar(Length::Max)),
                ("content", VarBinary(Length::Max)),
            ],
            1,
        );
    }
}

/// An attachment whose values CES cuts: `name` is "a" and 262,144 four-byte
/// characters (1 MiB + 1 byte: the cut falls inside the last one, so 1,048,573 bytes
/// are kept), `content` is 768 KiB (1.5 MiB as `0x` hex: 524,287 bytes are kept).
fn oversized_attachment(k: u64) -> Vec<Value> {
    let mut name = String::with_capacity(1 + 4 * 262_144);
    name.push('a');
    name.extend(std::iter::repeat_n('😀', 262_144));
    let content: Vec<u8> = (0..786_432u32).map(|i| (i % 251) as u8).collect();
    vec![
        Value::BigInt(i64::try_from(k).unwrap_or(i64::MAX)),
        Value::Text(name),
        Value::Binary(content),
    ]
}

/// The synthetic source.
pub struct SyntheticSource {
    db: Database,
    config: SyntheticConfig,
    rng: SplitMix64,
    generated: u64,
    /// The pace's origin: `generated_at_start` transactions were due at `started`.
    started: Instant,
    generated_at_start: u64,
    customers: Vec<i32>,
    orders: Vec<(i64, u32)>,
    next_customer: i32,
    next_order: i64,
    /// Resuming: the history up to a checkpoint's last event is generated first, in
    /// one go (rows below the second LSN, all delivered, dropped as it goes).
    catch_up: Option<(Lsn, Lsn)>,
    /// Keep every change row, as a database does for its readers (served to other
    /// processes, which may resume from further back than this one has read).
    keep_history: bool,
    /// Every transaction committed, kept for a test that replays them elsewhere.
    #[cfg(any(test, feature = "testing"))]
    committed: Option<Vec<Transaction>>,
}

impl SyntheticSource {
    pub fn new(config: SyntheticConfig) -> Self {
        let guid = Uuid::from_u64_pair(0x5359_4e54_4845_5449, config.seed);
        let mut db = Database::new("synthetic", guid);
        create_tables(&mut db, &config);
        SyntheticSource {
            db,
            rng: SplitMix64(config.seed),
            config,
            generated: 0,
            started: Instant::now(),
            generated_at_start: 0,
            customers: Vec::new(),
            orders: Vec::new(),
            next_customer: 1,
            next_order: 1,
            catch_up: None,
            keep_history: false,
            #[cfg(any(test, feature = "testing"))]
            committed: None,
        }
    }

    /// Keeps every change row instead of dropping what a probe has passed: for
    /// serving the workload as a database (the TDS stand-in), whose clients restart
    /// from their own checkpoints. Memory then grows with the history.
    pub fn keep_history(mut self) -> Self {
        self.keep_history = true;
        self
    }

    /// Gives the database another name (`DB_NAME()`, which events carry): one of a
    /// synthetic server's databases.
    pub fn rename_database(&mut self, name: &str) {
        self.db.rename(name);
    }

    /// Keeps every transaction it commits from now on, for [`committed`](Self::committed).
    #[cfg(any(test, feature = "testing"))]
    pub fn record_transactions(mut self) -> Self {
        self.committed = Some(Vec::new());
        self
    }

    /// The transactions committed since [`record_transactions`](Self::record_transactions).
    #[cfg(any(test, feature = "testing"))]
    pub fn committed(&self) -> &[Transaction] {
        self.committed.as_deref().unwrap_or_default()
    }

    /// Transactions generated so far.
    pub fn generated(&self) -> u64 {
        self.generated
    }

    /// Makes the first poll see the history up to `position` at once. Without it the
    /// per-call bound would hand a resumed poller history it has already delivered,
    /// which looks like nothing new (and stops an `--until-idle` run early).
    pub fn resume_from(&mut self, position: &crate::position::Position) {
        let target = position.last_event.map(|e| e.commit_lsn);
        let delivered = position.instances.values().min().copied();
        self.catch_up = target.map(|t| (t, delivered.unwrap_or(Lsn::ZERO)));
    }

    /// Generates the transactions due by now.
    fn advance(&mut self) -> Result<(), SourceError> {
        if let Some((target, delivered)) = self.catch_up.take() {
            let total = self.config.transactions.unwrap_or(u64::MAX);
            while self.generated < total && self.db.current_max_lsn().is_none_or(|m| m < target) {
                self.generate_one()?;
                if self.generated.is_multiple_of(GENERATED_PER_CALL) {
                    self.db.forget_below(delivered);
                }
            }
            self.db.forget_below(delivered);
            // The pace goes on from the checkpoint's point in the schedule, not from
            // its start: a restart is not silent for as long as the last run lasted.
            self.started = Instant::now();
            self.generated_at_start = self.generated;
            // And the usual amount past it, so the first poll finds something new.
        }
        let due = match self.config.rate_per_second {
            Some(rate) => self
                .generated_at_start
                .saturating_add((self.started.elapsed().as_secs_f64() * rate) as u64),
            None => u64::MAX,
        };
        let target = due.min(self.config.transactions.unwrap_or(u64::MAX));
        // Bound the work of one call so an endless, unpaced stream still polls.
        let target = target.min(self.generated + GENERATED_PER_CALL);
        while self.generated < target {
            self.generate_one()?;
        }
        Ok(())
    }

    fn generate_one(&mut self) -> Result<(), SourceError> {
        let k = self.generated;
        let statements = 1 + self.rng.below(4);
        let mut txn = Transaction::default();
        for s in 0..statements {
            let large = self.config.large_value_every > 0
                && k.is_multiple_of(self.config.large_value_every)
                && s == 0;
            txn = self.statement(txn, large);
        }
        let every = self.config.oversized_value_every;
        if every > 0 && k.is_multiple_of(every) {
            // No random numbers: the other tables' history stays as without it.
            txn = txn.insert(ATTACHMENTS, oversized_attachment(k));
        }
        #[cfg(any(test, feature = "testing"))]
        if let Some(committed) = &mut self.committed {
            committed.push(txn.clone());
        }
        self.db
            .commit(txn)
            .map_err(|message| SourceError::definite(format!("synthetic workload: {message}")))?;
        self.generated += 1;
        Ok(())
    }

    fn statement(&mut self, txn: Transaction, large: bool) -> Transaction {
        let choice = if large { 1 } else { self.rng.below(10) };
        // Bounded tables, so an endless stream runs in constant memory: at the cap,
        // an insert becomes a delete (orders) or an update (customers).
        let choice = match choice {
            0..=1 if !large && self.orders.len() >= LIVE_ROWS => 4,
            6.. if self.customers.len() >= LIVE_ROWS => 5,
            other => other,
        };
        match choice {
            0..=1 if !self.customers.is_empty() || large => self.insert_order(txn, large),
            2..=3 if !self.orders.is_empty() => {
                let pick = self.rng.below(self.orders.len() as u64) as usize;
                let (id, _) = self.orders[pick];
                let status = Value::TinyInt((self.rng.below(5) + 1) as u8);
                let total = Value::Decimal {
                    unscaled: i128::from(self.rng.below(10_000_000)),
                    scale: 2,
                };
                txn.update(
                    ORDERS,
                    vec![Value::BigInt(id)],
                    vec![("status", status), ("total", total)],
                )
            }
            4 if !self.orders.is_empty() => {
                let pick = self.rng.below(self.orders.len() as u64) as usize;
                let (id, lines) = self.orders.swap_remove(pick);
                let mut txn = txn;
                for line in 1..=lines {
                    txn = txn.delete(LINES, vec![Value::BigInt(id), Value::Int(line as i32)]);
                }
                txn.delete(ORDERS, vec![Value::BigInt(id)])
            }
            5 if !self.customers.is_empty() => {
                let pick = self.rng.below(self.customers.len() as u64) as usize;
                let id = self.customers[pick];
                let name = format!("Customer {id} “renamed” {}", self.rng.below(1000));
                txn.update(
                    CUSTOMERS,
                    vec![Value::Int(id)],
                    vec![("name", Value::Text(name))],
                )
            }
            _ => self.insert_customer(txn),
        }
    }

    fn insert_customer(&mut self, txn: Transaction) -> Transaction {
        let id = self.next_customer;
        self.next_customer += 1;
        self.customers.push(id);
        let created = NaiveDate::from_ymd_opt(2026, 1, 1)
            .and_then(|d| d.and_hms_nano_opt(0, 0, 0, 0))
            .unwrap_or_default()
            + chrono::Duration::nanoseconds((self.rng.below(1 << 40) * 100) as i64);
        txn.insert(
            CUSTOMERS,
            vec![
                Value::Int(id),
                Value::Text(format!("Zoë \"Customer\" {id}")),
                Value::Text(format!("customer{id}@example.com")),
                Value::Decimal {
                    unscaled: self.rng.below(1 << 40) as i128 - (1 << 39),
                    scale: 4,
                },
                Value::DateTime2 {
                    value: created,
                    scale: 7,
                },
                Value::Bit(self.rng.below(2) == 1),
            ],
        )
    }

    fn insert_order(&mut self, txn: Transaction, large: bool) -> Transaction {
        let mut txn = txn;
        if self.customers.is_empty() {
            txn = self.insert_customer(txn);
        }
        let customer = self.customers[self.rng.below(self.customers.len() as u64) as usize];
        let id = self.next_order;
        self.next_order += 1;
        let lines = 1 + self.rng.below(3) as u32;
        self.orders.push((id, lines));
        let note = if large {
            Value::Text("Large note with \"quotes\", é and 😀. ".repeat(8_000))
        } else if self.rng.below(3) == 0 {
            Value::Null
        } else {
            Value::Text(format!("Leave at door {}", self.rng.below(100)))
        };
        let offset = FixedOffset::east_opt(((self.rng.below(28) as i32) - 14) * 1800)
            .unwrap_or_else(|| chrono::Utc.fix());
        let placed = offset
            .from_local_datetime(
                &(NaiveDate::from_ymd_opt(2026, 8, 7)
                    .and_then(|d| d.and_hms_milli_opt(12, 0, 0, 0))
                    .unwrap_or_default()
                    + chrono::Duration::milliseconds(self.rng.below(1 << 32) as i64)),
            )
            .earliest()
            .unwrap_or_else(|| chrono::Utc::now().with_timezone(&offset));
        txn = txn.insert(
            ORDERS,
            vec![
                Value::BigInt(id),
                Value::Int(customer),
                Value::Decimal {
                    unscaled: i128::from(self.rng.below(10_000_000)),
                    scale: 2,
                },
                Value::TinyInt(1),
                note,
                Value::DateTimeOffset {
                    value: placed,
                    scale: 3,
                },
                Value::Guid(Uuid::from_u64_pair(self.rng.next(), self.rng.next())),
                Value::Float(self.rng.below(1_000_000) as f64 / 64.0),
            ],
        );
        for line in 1..=lines {
            txn = txn.insert(
                LINES,
                vec![
                    Value::BigInt(id),
                    Value::Int(line as i32),
                    Value::Text(format!("SKU{:<7}", self.rng.below(10_000))),
                    Value::SmallInt((1 + self.rng.below(20)) as i16),
                    Value::Decimal {
                        unscaled: i128::from(self.rng.below(100_000)),
                        scale: 2,
                    },
                ],
            );
        }
        txn
    }
}

impl CdcReads for SyntheticSource {
    async fn catalog(&mut self) -> Result<Catalog, SourceError> {
        Ok(self.db.catalog())
    }

    async fn max_lsn(&mut self) -> Result<MaxLsn, SourceError> {
        self.advance()?;
        Ok(self.db.max_lsn())
    }

    async fn min_lsn(&mut self, capture_instance: &str) -> Result<Option<Lsn>, SourceError> {
        Ok(self.db.min_lsn(capture_instance))
    }

    async fn lsn_time(
        &mut self,
        lsn: Lsn,
    ) -> Result<Option<crate::source::CommitTime>, SourceError> {
        Ok(self.db.lsn_time(lsn))
    }

    /// A paced workload has more on its way until every transaction is generated (an
    /// endless one always has); an unpaced one generates whatever a poll asks for.
    fn more_expected(&self) -> bool {
        self.config.rate_per_second.is_some()
            && self
                .config
                .transactions
                .is_none_or(|total| self.generated < total)
    }

    async fn probe(&mut self, probes: &[Probe], to: Lsn) -> Result<Vec<ProbeResult>, SourceError> {
        // Nothing at or below every instance's position will be asked for again in
        // this process: drop it to keep memory bounded.
        if let Some(low) = probes.iter().map(|p| p.after).min()
            && !self.keep_history
        {
            self.db.forget_below(low.increment().unwrap_or(low));
        }
        self.db.probe(probes, to)
    }

    async fn read_changes(
        &mut self,
        instance: &CaptureInstance,
        after: RowKey,
        to: Lsn,
        limit: usize,
    ) -> Result<Vec<ChangeRow>, SourceError> {
        self.db.read_changes(instance, after, to, limit)
    }

    /// The tables never change shape.
    async fn ddl_history(&mut self, _capture_instance: &str) -> Result<Vec<DdlEvent>, SourceError> {
        Ok(Vec::new())
    }
}

impl TableReads for SyntheticSource {
    async fn table_rows(&mut self, instance: &CaptureInstance) -> Result<Option<u64>, SourceError> {
        // The workload goes on while a table is loaded, as writers do.
        self.advance()?;
        if self.is_products(instance) {
            return Ok(Some(self.config.existing_rows));
        }
        Ok(self.db.table_rows(instance))
    }

    async fn read_table(
        &mut self,
        instance: &CaptureInstance,
        cursor: TableCursor<'_>,
        limit: usize,
    ) -> Result<Vec<Vec<Value>>, SourceError> {
        if !self.is_products(instance) {
            self.advance()?;
            return self.db.read_table(instance, cursor, limit);
        }
        let after = match cursor {
            TableCursor::Start => 0,
            TableCursor::AfterKey([Some(id)]) => {
                id.parse::<u64>().map_err(|_| SourceError::Malformed {
                    capture_instance: instance.name.clone(),
                    message: format!("read_table: `{id}` is not a products id"),
                })?
            }
            _ => {
                return Err(SourceError::Malformed {
                    capture_instance: instance.name.clone(),
                    message: "read_table: the cursor does not match the key (id)".into(),
                });
            }
        };
        let end = after
            .saturating_add(limit as u64)
            .min(self.config.existing_rows);
        Ok((after + 1..=end)
            .map(|id| product(self.config.seed, id))
            .collect())
    }
}

impl FactReads for SyntheticSource {
    async fn server_facts(&mut self) -> Result<crate::source::ServerFacts, SourceError> {
        Ok(self.db.server_facts())
    }
}

impl CaptureDdl for SyntheticSource {}

impl SourceClock for SyntheticSource {
    /// The clock its commit times are on.
    fn clock(&self) -> Option<chrono::DateTime<chrono::Utc>> {
        Some(self.db.clock())
    }
}

impl SyntheticSource {
    /// Whether `instance` is the generated `dbo.products` (whose columns never change).
    fn is_products(&self, instance: &CaptureInstance) -> bool {
        self.config.existing_rows > 0 && instance.schema == "dbo" && instance.table == PRODUCTS
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::poller::{PollOutcome, Poller, PollerConfig};

    async fn history(config: SyntheticConfig, batch_size: usize) -> Vec<crate::event::Change> {
        let poller_config = PollerConfig {
            batch_size,
            ..PollerConfig::default()
        };
        let mut poller = Poller::new(SyntheticSource::new(config), poller_config, None);
        let mut out = Vec::new();
        while let PollOutcome::Batch(batch) = poller.poll().await.unwrap() {
            out.extend(batch.changes);
        }
        out
    }

    #[tokio::test]
    async fn the_same_seed_gives_the_same_history() {
        let config = SyntheticConfig {
            seed: 42,
            transactions: Some(300),
            rate_per_second: None,
            large_value_every: 100,
            existing_rows: 0,
            oversized_value_every: 0,
        };
        let a = history(config.clone(), 1000).await;
        let b = history(config.clone(), 7).await;
        assert!(a.len() > 300, "{} events", a.len());
        assert_eq!(a, b);
        let other = history(SyntheticConfig { seed: 43, ..config }, 1000).await;
        assert_ne!(a, other);
        let ops: std::collections::HashSet<_> = a.iter().map(|c| c.operation).collect();
        assert_eq!(ops.len(), 3, "inserts, updates and deletes");
    }

    #[tokio::test]
    async fn rows_already_read_are_dropped() {
        let source = SyntheticSource::new(SyntheticConfig {
            transactions: Some(30_000),
            ..SyntheticConfig::default()
        });
        let mut poller = Poller::new(source, PollerConfig::default(), None);
        let mut most_held = 0;
        while let PollOutcome::Batch(_) = poller.poll().await.unwrap() {
            most_held = most_held.max(poller.source().db.change_rows());
        }
        let read = poller.source().db.rows_read();
        assert!(read > 100_000, "{read} rows read");
        // Generation runs 10,000 transactions ahead at most, and what was read goes.
        assert!(
            most_held < read / 2,
            "held up to {most_held} of {read} rows"
        );
    }

    /// A paced workload is not idle between two transactions: it expects more until
    /// every transaction is generated; an unpaced one never waits for anything.
    #[tokio::test]
    async fn a_paced_workload_expects_more_until_it_is_generated() {
        let paced = |transactions| SyntheticConfig {
            transactions,
            rate_per_second: Some(1e12),
            ..SyntheticConfig::default()
        };
        let mut source = SyntheticSource::new(paced(Some(5)));
        assert!(source.more_expected(), "nothing generated yet");
        source.max_lsn().await.unwrap();
        assert_eq!(source.generated(), 5);
        assert!(!source.more_expected(), "all 5 generated");
        let mut endless = SyntheticSource::new(paced(None));
        endless.max_lsn().await.unwrap();
        assert!(
            endless.more_expected(),
            "an endless paced workload always has more"
        );
        let unpaced = SyntheticSource::new(SyntheticConfig {
            transactions: None,
            ..SyntheticConfig::default()
        });
        assert!(!unpaced.more_expected());
    }

    /// A restarted paced workload goes on from the checkpoint's point in its schedule:
    /// at 1,000 a second, 20 ms after resuming at transaction 500, more than the
    /// catch-up was generated (replaying the schedule from its start would wait half
    /// a second).
    #[tokio::test(start_paused = true)]
    async fn a_resumed_paced_workload_goes_on_at_once() {
        let unpaced = SyntheticConfig {
            transactions: Some(500),
            ..SyntheticConfig::default()
        };
        let mut poller = Poller::new(SyntheticSource::new(unpaced), PollerConfig::default(), None);
        while let PollOutcome::Batch(_) = poller.poll().await.unwrap() {}
        let position = poller.position().clone();
        let mut resumed = SyntheticSource::new(SyntheticConfig {
            transactions: None,
            rate_per_second: Some(1000.0),
            ..SyntheticConfig::default()
        });
        resumed.resume_from(&position);
        resumed.max_lsn().await.unwrap();
        let caught_up = resumed.generated();
        assert!(
            caught_up >= 499,
            "the history up to the checkpoint: {caught_up}"
        );
        tokio::time::advance(std::time::Duration::from_millis(20)).await;
        resumed.max_lsn().await.unwrap();
        assert!(
            resumed.generated() >= caught_up + 20,
            "{} after catching up to {caught_up}",
            resumed.generated()
        );
    }
}
