//! Commit times: `cdc.lsn_time_mapping.tran_end_time` is server-local time.
//!
//! CES appends `Z` to that local time (a documented bug). We convert it to true UTC
//! with the source's time zone: an IANA name (correct across daylight-saving changes),
//! a fixed offset, or by default the server's own time zone. Where the server can name
//! its zone (`CURRENT_TIMEZONE_ID()`, SQL Server 2022+ and Azure SQL), each change row
//! carries the offset in force at its own commit time, computed by the server with
//! `AT TIME ZONE`; older servers cannot tell, and the offset they report at startup is
//! used with a warning. The setting `"ces"` reproduces CES's behaviour.
//!
//! **The repeated hour.** When the clocks go back, a local time in the hour they
//! repeat has two readings, an hour apart. `AT TIME ZONE` always gives the first
//! (the offset before the change, *AT TIME ZONE (Transact-SQL)*), and so does
//! reading the local time alone. Commits come in LSN order, which is the order they
//! happened in, so the stream keeps a clock ([`CommitClock`]): the latest commit
//! instant it has read. A local time in the repeated hour whose first reading lies
//! before that clock (by more than [`CLOCK_TOLERANCE`]) happened in the second
//! occurrence. The clock is saved in the checkpoint with the position, so a restart
//! reads the same commits the same way and a re-sent event keeps its bytes. What no
//! clock can tell: a commit in the second occurrence whose local time is later than
//! every commit's since the first occurrence began (the database recorded nothing in
//! between): it is read as the first occurrence.
//!
//! On a server that cannot name its zone (2016–2019), `"server"` cannot be right
//! across a daylight-saving change, so it is refused by name
//! ([`TimeZoneSetting::resolve`]).

use chrono::{
    DateTime, FixedOffset, LocalResult, NaiveDateTime, Offset as _, TimeDelta, TimeZone, Utc,
};
use chrono_tz::Tz;

/// The `source.time_zone` setting.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum TimeZoneSetting {
    /// The server's own time zone: per commit when the server names its zone, else
    /// the offset it reports at startup (`DATEPART(TZOFFSET, SYSDATETIMEOFFSET())`).
    #[default]
    Server,
    /// An IANA zone such as `Europe/Berlin`.
    Named(Tz),
    /// A fixed offset such as `+02:00`.
    Fixed(FixedOffset),
    /// CES's behaviour: local time written with `Z`.
    CesLocalAsUtc,
}

/// An unusable `source.time_zone`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{value:?} is not \"server\", \"ces\", \"UTC\", an offset like \"+02:00\" (at most ±14:00) or an IANA zone name like \"Europe/Berlin\""
)]
pub struct TimeZoneError {
    pub value: String,
}

impl TimeZoneSetting {
    pub fn parse(value: &str) -> Result<Self, TimeZoneError> {
        let error = || TimeZoneError {
            value: value.to_owned(),
        };
        match value {
            "server" | "" => return Ok(TimeZoneSetting::Server),
            "ces" => return Ok(TimeZoneSetting::CesLocalAsUtc),
            _ => {}
        }
        if let Some(sign) = value.chars().next().filter(|c| *c == '+' || *c == '-') {
            let (hours, minutes) = value[1..].split_once(':').ok_or_else(error)?;
            let hours: i32 = hours.parse().map_err(|_| error())?;
            let minutes: i32 = minutes.parse().map_err(|_| error())?;
            if hours > 14 || minutes > 59 {
                return Err(error());
            }
            let seconds = (hours * 60 + minutes) * 60 * if sign == '-' { -1 } else { 1 };
            return FixedOffset::east_opt(seconds)
                .map(TimeZoneSetting::Fixed)
                .ok_or_else(error);
        }
        value
            .parse::<Tz>()
            .map(TimeZoneSetting::Named)
            .map_err(|_| error())
    }

    /// The zone to use, given the server's reported offset in minutes and whether
    /// its change rows carry their own offsets (the server names its time zone).
    ///
    /// `"server"` on a server that cannot name its zone is refused: the offset it
    /// reports now is wrong for every commit on the other side of a daylight-saving
    /// change, and a re-read after a restart on the other side would give a re-sent
    /// event another `time`.
    pub fn resolve(
        &self,
        server_offset_minutes: i32,
        per_row: bool,
    ) -> Result<CommitTimeZone, UnknownServerZone> {
        // An offset beyond ±24 h cannot come from a server; fall back to UTC.
        let reported =
            FixedOffset::east_opt(server_offset_minutes * 60).unwrap_or_else(|| Utc.fix());
        Ok(match self {
            TimeZoneSetting::Server if per_row => {
                CommitTimeZone::ServerPerRow { fallback: reported }
            }
            TimeZoneSetting::Server => return Err(UnknownServerZone { reported }),
            TimeZoneSetting::Named(tz) => CommitTimeZone::Named(*tz),
            TimeZoneSetting::Fixed(offset) => CommitTimeZone::Fixed(*offset),
            TimeZoneSetting::CesLocalAsUtc => CommitTimeZone::LocalAsUtc,
        })
    }
}

/// `source.time_zone = "server"` on a server that cannot name its time zone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "source.time_zone = \"server\" cannot be right here: the server cannot name its time zone (CURRENT_TIMEZONE_ID() needs SQL Server 2022, Azure SQL Database or Managed Instance), and the offset it reports now ({reported}) is wrong for every commit on the other side of a daylight-saving change. Set source.time_zone to the server's IANA zone (for example \"Europe/Berlin\"; \"UTC\" if the server runs on UTC), to \"{reported}\" if its clock never changes, or to \"ces\" for CES's own behaviour (local time written with Z)"
)]
pub struct UnknownServerZone {
    /// `DATEPART(TZOFFSET, SYSDATETIMEOFFSET())` when the catalog was read.
    pub reported: FixedOffset,
}

/// What the server computed for a commit's local time `t` in its own zone
/// (`@P7` = `CURRENT_TIMEZONE_ID()`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerOffsets {
    /// `DATEPART(TZOFFSET, t AT TIME ZONE @P7)`, in minutes: in a repeated hour, the
    /// offset before the change.
    pub at: i16,
    /// The same for `DATEADD(minute, 60, t)`. It is exactly one hour less than
    /// [`at`](Self::at) when, and only when, `t` lies in an hour that a one-hour
    /// fall-back repeats: `t + 1 h` is then past the repeated hour, on the new
    /// offset, while `at` is the old one. (Before the repeated hour, `t + 1 h` is in
    /// it and reads with the old offset; after it, both read with the new one; and
    /// a spring-forward raises the offset instead.)
    pub hour_later: i16,
}

/// The instants a local commit time can be: `second` only in a repeated hour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Readings {
    pub first: DateTime<Utc>,
    pub second: Option<DateTime<Utc>>,
}

/// How far the commit clock may run ahead of a first reading before it counts as
/// past: commit times of neighbouring transactions can be out of LSN order by a few
/// milliseconds (and a clock step by a few seconds), never by most of an hour.
pub const CLOCK_TOLERANCE: chrono::TimeDelta = chrono::TimeDelta::seconds(10);

/// The latest commit instant read in LSN order; decides which reading of a repeated
/// hour's local time a commit is (see the module's comment).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommitClock {
    latest: Option<DateTime<Utc>>,
}

impl CommitClock {
    /// The clock saved in a checkpoint (`Position::commit_clock_ns`).
    pub fn from_nanos(nanos: Option<i64>) -> Self {
        CommitClock {
            latest: nanos.map(DateTime::from_timestamp_nanos),
        }
    }

    /// Moves a saved clock (`Position::commit_clock_ns`) to `instant` if that is
    /// later, as [`observe`](Self::observe) moves this one.
    pub fn advance_saved(saved: &mut Option<i64>, instant: DateTime<Utc>) {
        *saved = (*saved).max(instant.timestamp_nanos_opt());
    }

    /// What a checkpoint saves.
    pub fn nanos(&self) -> Option<i64> {
        self.latest.and_then(|t| t.timestamp_nanos_opt())
    }

    /// The instant of a commit read after every one the clock has seen.
    pub fn read(&mut self, readings: Readings) -> DateTime<Utc> {
        let chosen = match readings.second {
            Some(second)
                if self
                    .latest
                    .is_some_and(|l| l > readings.first + CLOCK_TOLERANCE) =>
            {
                second
            }
            _ => readings.first,
        };
        self.observe(chosen);
        chosen
    }

    /// Moves the clock to `instant` if that is later.
    pub fn observe(&mut self, instant: DateTime<Utc>) {
        self.latest = Some(self.latest.map_or(instant, |l| l.max(instant)));
    }
}

/// How local commit times become the UTC instants printed with `Z`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitTimeZone {
    /// The offset each change row carries (the server's zone at that commit time);
    /// `fallback` for a row without one.
    ServerPerRow {
        fallback: FixedOffset,
    },
    Fixed(FixedOffset),
    Named(Tz),
    LocalAsUtc,
}

impl CommitTimeZone {
    /// The instants a local commit time can be; `server` is what the server computed
    /// for that row, if anything.
    pub fn readings(&self, local: NaiveDateTime, server: Option<ServerOffsets>) -> Readings {
        let shift_seconds =
            |seconds: i32| Utc.from_utc_datetime(&(local - TimeDelta::seconds(i64::from(seconds))));
        let shift = |minutes: i16| shift_seconds(i32::from(minutes) * 60);
        let single = |first| Readings {
            first,
            second: None,
        };
        match self {
            CommitTimeZone::LocalAsUtc => single(Utc.from_utc_datetime(&local)),
            CommitTimeZone::ServerPerRow { fallback } => match server {
                Some(ServerOffsets { at, hour_later }) => Readings {
                    first: shift(at),
                    second: (i32::from(hour_later) == i32::from(at) - 60)
                        .then(|| shift(hour_later)),
                },
                None => single(shift_seconds(fallback.local_minus_utc())),
            },
            CommitTimeZone::Fixed(offset) => single(shift_seconds(offset.local_minus_utc())),
            CommitTimeZone::Named(tz) => match tz.from_local_datetime(&local) {
                LocalResult::Single(t) => single(t.with_timezone(&Utc)),
                LocalResult::Ambiguous(first, second) => Readings {
                    first: first.with_timezone(&Utc),
                    second: Some(second.with_timezone(&Utc)),
                },
                // The skipped hour when clocks go forward cannot be a real local
                // time; read it with the offset in force just before the change.
                LocalResult::None => {
                    let before = local - TimeDelta::hours(3);
                    let offset = match tz.from_local_datetime(&before) {
                        LocalResult::Single(t) | LocalResult::Ambiguous(t, _) => {
                            t.offset().fix().local_minus_utc()
                        }
                        LocalResult::None => 0,
                    };
                    single(shift_seconds(offset))
                }
            },
        }
    }

    /// How the zone was chosen, for the startup log line.
    pub fn describe(&self) -> String {
        match self {
            CommitTimeZone::ServerPerRow { .. } => {
                "the server's own time zone, the offset in force at each commit".to_owned()
            }
            CommitTimeZone::Fixed(offset) => format!("fixed offset {offset}"),
            CommitTimeZone::Named(tz) => format!("time zone {}", tz.name()),
            CommitTimeZone::LocalAsUtc => {
                "CES compatibility: server-local time written with Z".to_owned()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local(s: &str) -> NaiveDateTime {
        NaiveDateTime::parse_from_str(s, "%Y-%m-%d %H:%M:%S").unwrap()
    }

    fn hm(t: DateTime<Utc>) -> String {
        t.format("%Y-%m-%d %H:%M:%S").to_string()
    }

    fn utc(zone: &CommitTimeZone, s: &str) -> String {
        hm(zone.readings(local(s), None).first)
    }

    fn server(at: i16, hour_later: i16) -> Option<ServerOffsets> {
        Some(ServerOffsets { at, hour_later })
    }

    #[test]
    fn settings_parse_with_clear_errors() {
        assert_eq!(
            TimeZoneSetting::parse("server"),
            Ok(TimeZoneSetting::Server)
        );
        assert_eq!(
            TimeZoneSetting::parse("ces"),
            Ok(TimeZoneSetting::CesLocalAsUtc)
        );
        assert_eq!(
            TimeZoneSetting::parse("-05:30"),
            Ok(TimeZoneSetting::Fixed(
                FixedOffset::west_opt(5 * 3600 + 1800).unwrap()
            ))
        );
        assert!(matches!(
            TimeZoneSetting::parse("Europe/Berlin"),
            Ok(TimeZoneSetting::Named(_))
        ));
        assert!(matches!(
            TimeZoneSetting::parse("UTC"),
            Ok(TimeZoneSetting::Named(_))
        ));
        // The limits: ±14 hours, 59 minutes.
        for good in ["+14:00", "-14:00", "+01:59", "+00:00"] {
            assert!(
                matches!(TimeZoneSetting::parse(good), Ok(TimeZoneSetting::Fixed(_))),
                "{good}"
            );
        }
        for bad in ["Mars/Olympus", "+25:00", "+15:00", "+01:60", "+2", "+02:xx"] {
            let err = TimeZoneSetting::parse(bad).unwrap_err();
            assert!(
                err.to_string().starts_with(&format!("{bad:?} is not")),
                "{err}"
            );
        }
    }

    #[test]
    fn server_is_refused_where_the_server_cannot_name_its_zone() {
        let err = TimeZoneSetting::Server.resolve(60, false).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("source.time_zone"), "{text}");
        assert!(
            text.contains("\"+01:00\""),
            "names the offset to set: {text}"
        );
        assert!(text.contains("Europe/Berlin"), "{text}");
        // Every explicit setting works there.
        for setting in ["UTC", "+01:00", "ces", "Europe/Berlin"] {
            let zone = TimeZoneSetting::parse(setting).unwrap().resolve(60, false);
            assert!(zone.is_ok(), "{setting}");
        }
    }

    #[test]
    fn fixed_and_ces_offsets() {
        let west = TimeZoneSetting::parse("-05:00")
            .unwrap()
            .resolve(0, false)
            .unwrap();
        assert_eq!(utc(&west, "2026-12-31 22:00:00"), "2027-01-01 03:00:00");
        let ces = TimeZoneSetting::CesLocalAsUtc.resolve(120, true).unwrap();
        assert_eq!(utc(&ces, "2026-08-07 16:25:00"), "2026-08-07 16:25:00");
    }

    #[test]
    fn named_zones_follow_daylight_saving() {
        let berlin = TimeZoneSetting::parse("Europe/Berlin")
            .unwrap()
            .resolve(0, false)
            .unwrap();
        // Summer (+02:00) and winter (+01:00).
        assert_eq!(utc(&berlin, "2026-08-07 16:25:00"), "2026-08-07 14:25:00");
        assert_eq!(utc(&berlin, "2026-01-07 16:25:00"), "2026-01-07 15:25:00");
        // 2026-10-25 02:30 happens twice in Berlin: both readings, an hour apart.
        let twice = berlin.readings(local("2026-10-25 02:30:00"), None);
        assert_eq!(hm(twice.first), "2026-10-25 00:30:00");
        assert_eq!(twice.second.map(hm).as_deref(), Some("2026-10-25 01:30:00"));
        // Just outside the repeated hour there is one.
        for outside in ["2026-10-25 01:59:00", "2026-10-25 03:00:00"] {
            assert_eq!(berlin.readings(local(outside), None).second, None);
        }
        // 2026-03-29 02:30 does not exist; read with the winter offset.
        assert_eq!(utc(&berlin, "2026-03-29 02:30:00"), "2026-03-29 01:30:00");
    }

    #[test]
    fn the_server_zone_uses_each_rows_offset() {
        let zone = TimeZoneSetting::Server.resolve(60, true).unwrap();
        let at = local("2026-10-25 03:30:00");
        let first = |offsets| hm(zone.readings(at, offsets).first);
        // The offset the server computed for that commit wins over the one at startup.
        assert_eq!(first(server(120, 120)), "2026-10-25 01:30:00");
        assert_eq!(first(None), "2026-10-25 02:30:00");
        assert_eq!(first(server(-330, -330)), "2026-10-25 09:00:00");
        // Explicit settings ignore the row's offset.
        let fixed = TimeZoneSetting::parse("+00:00")
            .unwrap()
            .resolve(60, true)
            .unwrap();
        assert_eq!(
            hm(fixed.readings(at, server(120, 60)).first),
            "2026-10-25 03:30:00"
        );
    }

    #[test]
    fn the_server_zone_tells_a_repeated_hour_by_the_offset_an_hour_later() {
        let zone = TimeZoneSetting::Server.resolve(60, true).unwrap();
        let at = local("2026-10-25 02:30:00");
        // In the repeated hour: AT TIME ZONE gives the summer offset, an hour later
        // the winter one.
        let twice = zone.readings(at, server(120, 60));
        assert_eq!(hm(twice.first), "2026-10-25 00:30:00");
        assert_eq!(twice.second.map(hm).as_deref(), Some("2026-10-25 01:30:00"));
        // Before it (an hour later is inside it: still summer), after it, and a
        // spring-forward (the offset an hour later is higher): one reading.
        for offsets in [server(120, 120), server(60, 60), server(60, 120)] {
            assert_eq!(zone.readings(at, offsets).second, None, "{offsets:?}");
        }
        // A 30-minute change is not taken for a one-hour one.
        assert_eq!(zone.readings(at, server(660, 630)).second, None);
    }

    #[test]
    fn the_clock_reads_the_repeated_hour_in_commit_order() {
        let berlin = CommitTimeZone::Named(chrono_tz::Europe::Berlin);
        let mut clock = CommitClock::default();
        let mut read = |s: &str| hm(clock.read(berlin.readings(local(s), None)));
        // Summer time up to 03:00, then the clocks go back to 02:00.
        assert_eq!(read("2026-10-25 01:50:00"), "2026-10-24 23:50:00");
        assert_eq!(read("2026-10-25 02:10:00"), "2026-10-25 00:10:00");
        assert_eq!(read("2026-10-25 02:59:58"), "2026-10-25 00:59:58");
        // Commit order says the clock has passed 00:05 UTC: the second 02:05.
        assert_eq!(read("2026-10-25 02:05:00"), "2026-10-25 01:05:00");
        assert_eq!(read("2026-10-25 02:40:00"), "2026-10-25 01:40:00");
        assert_eq!(read("2026-10-25 03:10:00"), "2026-10-25 02:10:00");
    }

    #[test]
    fn the_clock_allows_commit_times_a_little_out_of_order() {
        let berlin = CommitTimeZone::Named(chrono_tz::Europe::Berlin);
        let mut clock = CommitClock::default();
        let mut read = |s: &str| hm(clock.read(berlin.readings(local(s), None)));
        assert_eq!(read("2026-10-25 02:10:05"), "2026-10-25 00:10:05");
        // Five seconds earlier in local time but a later LSN: still the first.
        assert_eq!(read("2026-10-25 02:10:00"), "2026-10-25 00:10:00");
        // Exactly the tolerance behind the clock: still the first; beyond it, not.
        assert_eq!(read("2026-10-25 02:10:15"), "2026-10-25 00:10:15");
        assert_eq!(read("2026-10-25 02:10:05"), "2026-10-25 00:10:05");
        assert_eq!(read("2026-10-25 02:10:04"), "2026-10-25 01:10:04");
    }

    #[test]
    fn the_clock_survives_a_checkpoint() {
        let berlin = CommitTimeZone::Named(chrono_tz::Europe::Berlin);
        let mut clock = CommitClock::default();
        assert_eq!(clock.nanos(), None);
        clock.read(berlin.readings(local("2026-10-25 02:50:00"), None));
        let saved = clock.nanos();
        let mut restored = CommitClock::from_nanos(saved);
        assert_eq!(restored, clock);
        let again = restored.read(berlin.readings(local("2026-10-25 02:20:00"), None));
        assert_eq!(hm(again), "2026-10-25 01:20:00");
        // The clock only moves forward, saved or not.
        restored.observe(DateTime::from_timestamp_nanos(0));
        assert!(restored.nanos() > saved);
        let mut on_disk = saved;
        CommitClock::advance_saved(&mut on_disk, DateTime::from_timestamp_nanos(0));
        assert_eq!(on_disk, saved);
        let mut empty = None;
        CommitClock::advance_saved(&mut empty, DateTime::from_timestamp_nanos(5));
        assert_eq!(empty, Some(5));
    }
}
