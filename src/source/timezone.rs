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
//! The conversion is a pure function of the local time, so an event re-read after a
//! restart gets the same `time` and its message the same bytes. In the hour that a
//! daylight-saving change repeats, a local time is read as its first occurrence.

use chrono::{DateTime, FixedOffset, LocalResult, NaiveDateTime, Offset as _, TimeZone, Utc};
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
    "source.time_zone = {value:?} is not \"server\", \"ces\", \"UTC\", an offset like \"+02:00\" or an IANA zone name like \"Europe/Berlin\""
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
    pub fn resolve(&self, server_offset_minutes: i32, per_row: bool) -> CommitTimeZone {
        // An offset beyond ±24 h cannot come from a server; fall back to UTC.
        let reported =
            FixedOffset::east_opt(server_offset_minutes * 60).unwrap_or_else(|| Utc.fix());
        match self {
            TimeZoneSetting::Server if per_row => {
                CommitTimeZone::ServerPerRow { fallback: reported }
            }
            TimeZoneSetting::Server => CommitTimeZone::Fixed(reported),
            TimeZoneSetting::Named(tz) => CommitTimeZone::Named(*tz),
            TimeZoneSetting::Fixed(offset) => CommitTimeZone::Fixed(*offset),
            TimeZoneSetting::CesLocalAsUtc => CommitTimeZone::LocalAsUtc,
        }
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
    /// The UTC instant of a local commit time; `row_offset_minutes` is the offset
    /// the server gave that row, if any.
    pub fn to_utc(&self, local: NaiveDateTime, row_offset_minutes: Option<i16>) -> DateTime<Utc> {
        let shift =
            |minutes: i64| Utc.from_utc_datetime(&(local - chrono::Duration::minutes(minutes)));
        match self {
            CommitTimeZone::LocalAsUtc => Utc.from_utc_datetime(&local),
            CommitTimeZone::ServerPerRow { fallback } => match row_offset_minutes {
                Some(minutes) => shift(i64::from(minutes)),
                None => shift(i64::from(fallback.local_minus_utc() / 60)),
            },
            CommitTimeZone::Fixed(offset) => Utc.from_utc_datetime(
                &(local - chrono::Duration::seconds(i64::from(offset.local_minus_utc()))),
            ),
            CommitTimeZone::Named(tz) => match tz.from_local_datetime(&local) {
                LocalResult::Single(t) => t.with_timezone(&Utc),
                // The repeated hour when clocks go back: the first occurrence.
                LocalResult::Ambiguous(first, _) => first.with_timezone(&Utc),
                // The skipped hour when clocks go forward cannot be a real local
                // time; read it with the offset in force just before the change.
                LocalResult::None => {
                    let before = local - chrono::Duration::hours(3);
                    let offset = match tz.from_local_datetime(&before) {
                        LocalResult::Single(t) | LocalResult::Ambiguous(t, _) => {
                            t.offset().fix().local_minus_utc()
                        }
                        LocalResult::None => 0,
                    };
                    Utc.from_utc_datetime(&(local - chrono::Duration::seconds(i64::from(offset))))
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

    fn utc(zone: &CommitTimeZone, s: &str) -> String {
        zone.to_utc(local(s), None)
            .format("%Y-%m-%d %H:%M:%S")
            .to_string()
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
        for bad in ["Mars/Olympus", "+25:00", "+2", "+02:xx"] {
            let err = TimeZoneSetting::parse(bad).unwrap_err();
            assert!(err.to_string().contains("source.time_zone"), "{err}");
        }
    }

    #[test]
    fn fixed_and_server_offsets() {
        let server = TimeZoneSetting::Server.resolve(120, false);
        assert_eq!(utc(&server, "2026-08-07 16:25:00"), "2026-08-07 14:25:00");
        let west = TimeZoneSetting::parse("-05:00").unwrap().resolve(0, false);
        assert_eq!(utc(&west, "2026-12-31 22:00:00"), "2027-01-01 03:00:00");
        let ces = TimeZoneSetting::CesLocalAsUtc.resolve(120, true);
        assert_eq!(utc(&ces, "2026-08-07 16:25:00"), "2026-08-07 16:25:00");
    }

    #[test]
    fn named_zones_follow_daylight_saving() {
        let berlin = TimeZoneSetting::parse("Europe/Berlin")
            .unwrap()
            .resolve(0, true);
        // Summer (+02:00) and winter (+01:00).
        assert_eq!(utc(&berlin, "2026-08-07 16:25:00"), "2026-08-07 14:25:00");
        assert_eq!(utc(&berlin, "2026-01-07 16:25:00"), "2026-01-07 15:25:00");
        // 2026-10-25 02:30 happens twice in Berlin: the first (summer time) is taken.
        assert_eq!(utc(&berlin, "2026-10-25 02:30:00"), "2026-10-25 00:30:00");
        // 2026-03-29 02:30 does not exist; read with the winter offset.
        assert_eq!(utc(&berlin, "2026-03-29 02:30:00"), "2026-03-29 01:30:00");
    }

    #[test]
    fn the_server_zone_uses_each_rows_offset() {
        let server = TimeZoneSetting::Server.resolve(60, true);
        let at = local("2026-10-25 03:30:00");
        // The offset the server computed for that commit wins over the one at startup.
        assert_eq!(
            server.to_utc(at, Some(120)).format("%H:%M").to_string(),
            "01:30"
        );
        assert_eq!(server.to_utc(at, None).format("%H:%M").to_string(), "02:30");
        assert_eq!(
            server.to_utc(at, Some(-330)).format("%H:%M").to_string(),
            "09:00"
        );
        // Explicit settings ignore the row's offset.
        let fixed = TimeZoneSetting::parse("+00:00").unwrap().resolve(60, true);
        assert_eq!(
            fixed.to_utc(at, Some(120)).format("%H:%M").to_string(),
            "03:30"
        );
    }
}
