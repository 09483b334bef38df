//! Helpers several in-process suites share.

use mssql_ces::event::Change;
use mssql_ces::event::value::{Length, SqlType};
use mssql_ces::source::poller::{PollOutcome, Poller};
use mssql_ces::source::sim::{CdcSimulator, SimColumn};
use mssql_ces::source::{ChangeSource, SourceError};
use uuid::Uuid;

/// Polls until idle; every change on the way.
pub async fn drain<S: ChangeSource>(poller: &mut Poller<S>) -> Result<Vec<Change>, SourceError> {
    let mut changes = Vec::new();
    loop {
        match poller.poll().await? {
            PollOutcome::Idle => return Ok(changes),
            PollOutcome::Batch(batch) => changes.extend(batch.changes),
        }
    }
}

/// Database `Shop` on a server at `utc_offset_minutes`, with `dbo.T (Id int PRIMARY
/// KEY, Name nvarchar(50))`, not yet enabled.
pub fn shop_with_t(utc_offset_minutes: i32) -> CdcSimulator {
    let sim = CdcSimulator::new("Shop", Uuid::from_u128(7), utc_offset_minutes);
    sim.create_table(
        "dbo",
        "T",
        vec![
            SimColumn::new("Id", SqlType::Int),
            SimColumn::new("Name", SqlType::NVarChar(Length::Bounded(50))),
        ],
        &["Id"],
    );
    sim
}
