//! The simulated server's clock and time zone: what `AT TIME ZONE` gives a local
//! time (Learn, *AT TIME ZONE (Transact-SQL)*: a local time in the hour the clocks
//! repeat gets the offset before the change, one in the skipped hour the offset
//! after it), and the offsets the change query's two zone columns carry.

use chrono::{Duration, NaiveDateTime, Offset as _, TimeZone as _};
use chrono_tz::Tz;

use super::SimState;
use mssql_ces::source::ServerOffsets;

impl SimState {
    /// The simulated server's clock in UTC (its local time less its zone's offset;
    /// UTC when it has no zone).
    pub(super) fn utc_now(&self) -> chrono::DateTime<chrono::Utc> {
        let later = self
            .time_zone
            .filter(|_| self.second_occurrence)
            .and_then(|tz| match tz.offset_from_local_datetime(&self.now) {
                chrono::LocalResult::Ambiguous(_, second) => Some(second.fix()),
                _ => None,
            });
        let seconds = match later {
            Some(offset) => offset.local_minus_utc(),
            None => i32::from(self.offset_at(self.now).unwrap_or(0)) * 60,
        };
        (self.now - Duration::seconds(i64::from(seconds))).and_utc()
    }

    /// What the change query's `AT TIME ZONE @P7` columns give a local commit time:
    /// the offset at it and an hour later.
    pub(super) fn offsets_at(&self, local: NaiveDateTime) -> Option<ServerOffsets> {
        Some(ServerOffsets {
            at: self.offset_at(local)?,
            hour_later: self.offset_at(local + Duration::minutes(60))?,
        })
    }

    /// The offset SQL Server's `AT TIME ZONE` gives a local time in the server's zone.
    pub(super) fn offset_at(&self, local: NaiveDateTime) -> Option<i16> {
        let tz = self.time_zone?;
        let offset = match tz.offset_from_local_datetime(&local) {
            chrono::LocalResult::Single(o) => o.fix(),
            // The repeated hour: the offset before the change.
            chrono::LocalResult::Ambiguous(first, _) => first.fix(),
            // The skipped hour: the offset after the change.
            chrono::LocalResult::None => tz
                .offset_from_local_datetime(&(local + Duration::hours(3)))
                .earliest()?
                .fix(),
        };
        i16::try_from(offset.local_minus_utc() / 60).ok()
    }
}

/// The IANA zone without daylight saving at a whole-hour offset: `UTC`, or
/// `Etc/GMT-2` for +02:00 (the `Etc` names count the other way).
pub(super) fn zone_at_offset(minutes: i32) -> Option<Tz> {
    if minutes == 0 {
        return Some(chrono_tz::UTC);
    }
    if minutes % 60 != 0 {
        return None;
    }
    let hours = minutes / 60;
    let name = if hours > 0 {
        format!("Etc/GMT-{hours}")
    } else {
        format!("Etc/GMT+{}", -hours)
    };
    name.parse().ok()
}
