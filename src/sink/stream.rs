//! stdout and file sinks: newline-delimited events, for trying mssql-ces out and for
//! debugging without a broker.
//!
//! JSON messages are written as they are (the encoder escapes every newline, so a
//! message is one line); Avro messages as one base64 line each. A file is flushed and
//! fsynced at the end of every batch, before any checkpoint that covers the batch.
//!
//! **A regular file is written exactly once.** The checkpoint records the file's
//! length after the last fsync it covers ([`StreamSink::durable_length`]); a start
//! truncates the file to that length before appending. Whatever a crash left after it
//! — a torn line, lines of batches not yet checkpointed — is cut off and written again
//! by the resumed run, so the file holds every event once and no torn line. A path
//! that is not a regular file (`/dev/stdout`, a pipe) is written as a stream: no
//! truncation, no fsync, at least once.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::PathBuf;

use base64::Engine as _;

use super::{Delivery, OutgoingMessage, SinkError};
use crate::event::Encoding;
use crate::position::SinkFile;

/// Standard output, one event per line (Avro: base64). No settings of its own.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StdoutSinkConfig {}

/// A file, one event per line (Avro: base64), appended exactly once: it is fsynced
/// before any checkpoint that covers it, and cut back to the checkpoint's length at a
/// start. See [Delivery guarantees](delivery.md).
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileSinkConfig {
    /// The output file. The checkpoint's own files are refused. The run holds an
    /// exclusive lock (`flock`) on it, taken before anything in it is cut: a second
    /// stream pointed at the same file is refused by name.
    pub path: PathBuf,
}

enum Output {
    Stdout(BufWriter<std::io::Stdout>),
    File(BufWriter<File>, PathBuf),
}

/// What the checkpoint says about the output file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resume {
    /// No checkpoint: the file must be empty or absent.
    Fresh,
    /// The file's length at the checkpoint (written before checkpoints named the
    /// file).
    At(u64),
    /// The file's length at the checkpoint and which file it was: `sink.path` must
    /// hold the recorded last event at that length before anything is cut.
    Checked { length: u64, file: SinkFile },
    /// A checkpoint that does not record the file's length (written by another sink
    /// or an older version): append, with a warning.
    Unknown,
}

/// What a start does with an output file of `found` bytes: the length it keeps (cutting
/// what was written after the checkpoint), or why it refuses the file. `check` asks
/// the same before a run.
pub fn kept_length(path: &std::path::Path, found: u64, resume: &Resume) -> Result<u64, SinkError> {
    match *resume {
        Resume::Checked { length, ref file } => {
            if length > found && file.path != absolute(path) {
                return Err(SinkError::definite(format!(
                    "sink.path {} holds {found} bytes, fewer than the {length} the checkpoint says were written to {}: point sink.path at that file, or move the checkpoint away to start over",
                    path.display(),
                    file.path
                )));
            }
            kept_length(path, found, &Resume::At(length))?;
            verify_file(path, length, file)?;
            Ok(length)
        }
        Resume::At(length) if length <= found => Ok(length),
        Resume::At(length) => Err(SinkError::definite(format!(
            "sink.path {} holds {found} bytes, fewer than the {length} the checkpoint says were written: it was truncated or replaced; move the checkpoint away to start over",
            path.display()
        ))),
        Resume::Fresh if found > 0 => Err(SinkError::definite(format!(
            "sink.path {} already holds {found} bytes and there is no checkpoint saying what they are: move the file away (or restore its checkpoint) so that it holds every event exactly once",
            path.display()
        ))),
        Resume::Fresh => Ok(0),
        Resume::Unknown => Ok(found),
    }
}

impl Resume {
    /// What a checkpoint says of the output file: with none (`None`), the file must
    /// be fresh; else the length it recorded (and which file, where it says), or
    /// unknown where it recorded none.
    pub fn from_checkpoint(position: Option<&crate::position::Position>) -> Self {
        let Some(position) = position else {
            return Resume::Fresh;
        };
        match (position.sink_length, &position.sink_file) {
            (Some(length), Some(file)) => Resume::Checked {
                length,
                file: (**file).clone(),
            },
            (Some(length), None) => Resume::At(length),
            (None, _) => Resume::Unknown,
        }
    }

    /// The last event id the checkpoint records of the file.
    fn last_id(&self) -> Option<uuid::Uuid> {
        match self {
            Resume::Checked { file, .. } => file.last_id,
            _ => None,
        }
    }
}

/// `path` made absolute (as the checkpoint records it); as given when that fails.
fn absolute(path: &std::path::Path) -> String {
    std::path::absolute(path)
        .unwrap_or_else(|_| path.to_owned())
        .display()
        .to_string()
}

/// How far back from the checkpoint's length a start reads for the line that ends
/// there; a longer line is checked on its last part (an event's id is near its
/// start in JSON, so such a file fails the check rather than passing it wrongly).
const LAST_LINE_LIMIT: u64 = 64 << 20;

/// Whether `path` is the file the checkpoint was written for: the line ending at
/// `length` holds the recorded last event's id (in the JSON, or in the Avro line's
/// base64-decoded bytes). Checked before anything is cut: a checkpoint of another
/// file (another stream's, another database's, a `sink.path` pointed elsewhere)
/// must not truncate a file that is not ours.
pub fn verify_file(path: &std::path::Path, length: u64, file: &SinkFile) -> Result<(), SinkError> {
    let Some(id) = file.last_id else {
        return Ok(());
    };
    let io = |e: std::io::Error| SinkError::io(path, Some("sink.path"), e);
    let line = last_line(path, length).map_err(io)?.unwrap_or_default();
    let id_text = id.hyphenated().to_string();
    let holds = |bytes: &[u8]| {
        bytes
            .windows(id_text.len())
            .any(|w| w == id_text.as_bytes())
    };
    let decoded = base64::engine::general_purpose::STANDARD.decode(&line);
    if holds(&line) || decoded.is_ok_and(|d| holds(&d)) {
        let here = absolute(path);
        if here != file.path {
            tracing::info!(path = %here, recorded = %file.path, "sink.path is the file the checkpoint was written for, under another path");
        }
        return Ok(());
    }
    Err(SinkError::definite(format!(
        "sink.path {} is not the file the checkpoint was written for ({}): its line ending at byte {length} does not hold event {id}, the last the checkpoint covers; point sink.path at that file, or move the checkpoint away to start over",
        path.display(),
        file.path
    )))
}

/// The line of `path` that ends (with its newline) at `length`, without the
/// newline; `None` when the byte before `length` is no newline (no checkpoint of
/// ours ends there).
fn last_line(path: &std::path::Path, length: u64) -> std::io::Result<Option<Vec<u8>>> {
    use std::io::{Read as _, Seek as _, SeekFrom};
    let mut file = File::open(path)?;
    let start = length.saturating_sub(LAST_LINE_LIMIT);
    file.seek(SeekFrom::Start(start))?;
    let mut tail = Vec::new();
    file.take(length - start).read_to_end(&mut tail)?;
    if tail.last() != Some(&b'\n') || tail.len() as u64 != length - start {
        return Ok(None);
    }
    tail.pop();
    let begin = tail
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |at| at + 1);
    Ok(Some(tail.split_off(begin)))
}

pub struct StreamSink {
    output: Output,
    encoding: Encoding,
    /// Bytes in a regular output file; `None` for a stream.
    length: Option<u64>,
    /// `length` at the last fsync.
    durable: Option<u64>,
    /// A stream that lands in a regular file (`> out.jsonl`): fsynced at each batch
    /// end too, so what a checkpoint covers is on disk.
    stream_in_file: bool,
    /// A regular output file's absolute path, as the checkpoint records it.
    absolute: Option<String>,
    /// The id of the last event written, and of the last one fsynced.
    last_id: Option<uuid::Uuid>,
    durable_last_id: Option<uuid::Uuid>,
    /// Each line is a whole Kafka record (`{"topic","key","value","headers"}`), for
    /// the Debezium format, whose keys and tombstones matter; else the value alone.
    records: bool,
}

/// Standard output as the system names it elsewhere: what a process sees of its
/// fd 1 under a path.
const STDOUT_ALIAS: &str = "/proc/self/fd/1";

/// Whether `path` is a stream rather than a file of ours: standard output under any
/// name (`/dev/stdout`, `/dev/fd/1`, `/proc/self/fd/1`, or the very file fd 1 was
/// redirected to), or another inherited descriptor (`/dev/fd/N`). Such a path is
/// never cut back to a checkpoint's length: it may hold the user's own lines.
fn is_stream_path(path: &std::path::Path) -> bool {
    let text = path.to_string_lossy();
    if text == "/dev/stdout"
        || text == "/dev/stderr"
        || text.starts_with("/dev/fd/")
        || text.starts_with("/proc/self/fd/")
    {
        return true;
    }
    same_file(path, std::path::Path::new(STDOUT_ALIAS))
}

/// Whether two paths are the same file (device and inode).
fn same_file(a: &std::path::Path, b: &std::path::Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt as _;
        match (std::fs::metadata(a), std::fs::metadata(b)) {
            (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
            _ => false,
        }
    }
    #[cfg(not(unix))]
    {
        let _ = (a, b);
        false
    }
}

/// Whether the regular file behind `path` is not empty and does not end with a
/// newline: a line torn by a kill, after which a restarted stream must start a new
/// line. False for anything that cannot be read back (a pipe, a terminal).
fn ends_mid_line(path: &std::path::Path) -> bool {
    use std::io::{Read as _, Seek as _, SeekFrom};
    let Ok(mut file) = File::open(path) else {
        return false;
    };
    let regular = file.metadata().is_ok_and(|m| m.is_file() && m.len() > 0);
    if !regular || file.seek(SeekFrom::End(-1)).is_err() {
        return false;
    }
    let mut last = [0u8; 1];
    file.read_exact(&mut last).is_ok() && last[0] != b'\n'
}

/// Syncs the directory holding `path`: a new file's directory entry is durable only
/// then; without it, a power loss could lose the file the checkpoint says holds
/// lines.
fn sync_directory_of(path: &std::path::Path) -> std::io::Result<()> {
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    File::open(parent).and_then(|d| d.sync_all())
}

/// A record as one JSON line: `{"topic":…,"key":…,"value":…,"headers":{…}}`, the
/// key and value as written (JSON text) or `null` (no key; a tombstone), header
/// values as strings.
fn record_line(message: &OutgoingMessage, encoding: Encoding) -> Vec<u8> {
    use base64::Engine as _;
    // JSON as it is; Avro (wire format) as a base64 string.
    let text = |bytes: &[u8]| match encoding {
        Encoding::Json => String::from_utf8_lossy(bytes).into_owned(),
        Encoding::Avro => {
            serde_json::Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
                .to_string()
        }
    };
    let mut out = String::from("{\"topic\":");
    out.push_str(&serde_json::Value::String(message.topic.clone()).to_string());
    out.push_str(",\"key\":");
    out.push_str(
        message
            .key
            .as_deref()
            .map(text)
            .as_deref()
            .unwrap_or("null"),
    );
    out.push_str(",\"value\":");
    if message.tombstone {
        out.push_str("null");
    } else {
        out.push_str(&text(&message.payload));
    }
    out.push_str(",\"headers\":{");
    for (i, (name, value)) in message.headers.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&serde_json::Value::String((*name).to_owned()).to_string());
        out.push(':');
        out.push_str(
            &serde_json::Value::String(String::from_utf8_lossy(value).into_owned()).to_string(),
        );
    }
    out.push_str("}}");
    out.into_bytes()
}

/// Whether `path` is a regular file.
fn is_regular(path: &std::path::Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file())
}

impl StreamSink {
    pub fn stdout(encoding: Encoding) -> Self {
        let alias = std::path::Path::new(STDOUT_ALIAS);
        let mut writer = BufWriter::new(std::io::stdout());
        if ends_mid_line(alias) {
            // A torn line from a killed run: this one starts on a line of its own.
            let _ = writer.write_all(b"\n");
        }
        StreamSink {
            output: Output::Stdout(writer),
            encoding,
            length: None,
            durable: None,
            stream_in_file: is_regular(alias),
            absolute: None,
            last_id: None,
            durable_last_id: None,
            records: false,
        }
    }

    /// Opens `path` for appending, creating it; a regular file is first cut back to
    /// what the checkpoint covers (see the module documentation).
    pub fn file(path: PathBuf, encoding: Encoding, resume: Resume) -> Result<Self, SinkError> {
        let io = |e: std::io::Error| SinkError::io(&path, Some("sink.path"), e);
        if is_stream_path(&path) {
            let stream_in_file = is_regular(&path);
            let torn = ends_mid_line(&path);
            let file = OpenOptions::new().append(true).open(&path).map_err(io)?;
            let mut writer = BufWriter::new(file);
            if torn {
                writer.write_all(b"\n").map_err(io)?;
            }
            return Ok(StreamSink {
                output: Output::File(writer, path),
                encoding,
                length: None,
                durable: None,
                stream_in_file,
                absolute: None,
                last_id: None,
                durable_last_id: None,
                records: false,
            });
        }
        let existed = path.exists();
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(io)?;
        let metadata = file.metadata().map_err(io)?;
        if metadata.is_file() {
            // Ours alone, before anything is cut: a second process (another stream
            // pointed at the same file) is refused rather than truncating our lines.
            match file.try_lock() {
                Ok(()) => {}
                Err(std::fs::TryLockError::WouldBlock) => {
                    return Err(SinkError::definite(format!(
                        "sink.path {} is being written by another process (another stream, or a second run of this one without its checkpoint lock): two streams may not write one file",
                        path.display()
                    )));
                }
                Err(std::fs::TryLockError::Error(e)) => return Err(io(e)),
            }
        }
        if !existed && metadata.is_file() {
            sync_directory_of(&path).map_err(io)?;
        }
        let length = if metadata.is_file() {
            let found = metadata.len();
            let keep = kept_length(&path, found, &resume)?;
            if resume == Resume::Unknown {
                tracing::warn!(path = %path.display(), "the checkpoint does not record this file's length: appending, and a crash before this run's first checkpoint may repeat events");
            }
            if keep < found {
                tracing::info!(path = %path.display(), cut_bytes = found - keep, "removing what was written after the last checkpoint; it is written again");
                file.set_len(keep).map_err(io)?;
                file.sync_all().map_err(io)?;
            }
            Some(keep)
        } else {
            None
        };
        let last_id = resume.last_id();
        Ok(StreamSink {
            absolute: length.map(|_| absolute(&path)),
            output: Output::File(BufWriter::new(file), path),
            encoding,
            length,
            durable: length,
            stream_in_file: false,
            last_id,
            durable_last_id: last_id,
            records: false,
        })
    }

    /// The file's length at the last fsync; `None` for stdout and other streams.
    pub fn durable_length(&self) -> Option<u64> {
        self.durable
    }

    /// Which file [`StreamSink::durable_length`] is of, as the checkpoint records
    /// it; `None` for stdout and other streams.
    pub fn durable_file(&self) -> Option<SinkFile> {
        self.durable
            .and(self.absolute.as_ref())
            .map(|path| SinkFile {
                path: path.clone(),
                last_id: self.durable_last_id,
            })
    }

    fn io(&self, e: std::io::Error) -> SinkError {
        match &self.output {
            Output::Stdout(_) => SinkError::io(std::path::Path::new("stdout"), None, e),
            Output::File(_, p) => SinkError::io(p, Some("sink.path"), e),
        }
    }

    /// Lines are whole records (see [`StreamSink::records`]).
    pub fn with_records(mut self, records: bool) -> Self {
        self.records = records;
        self
    }

    pub fn send(&mut self, message: OutgoingMessage) -> Result<Delivery, SinkError> {
        let line = match self.encoding {
            _ if self.records => record_line(&message, self.encoding),
            Encoding::Json => message.payload,
            Encoding::Avro => base64::engine::general_purpose::STANDARD
                .encode(&message.payload)
                .into_bytes(),
        };
        let writer: &mut dyn Write = match &mut self.output {
            Output::Stdout(w) => w,
            Output::File(w, _) => w,
        };
        let result = writer
            .write_all(&line)
            .and_then(|()| writer.write_all(b"\n"));
        result.map_err(|e| self.io(e))?;
        if let Some(length) = &mut self.length {
            *length += line.len() as u64 + 1;
            self.last_id = message.message_id;
        }
        Ok(Delivery::Settled(Ok(())))
    }

    /// Flushes, and for a regular file (stdout redirected to one included), fsyncs on
    /// a blocking thread: a hung disk holds that thread, not an async worker, and a
    /// shutdown can leave it behind. A pipe or a terminal cannot be fsynced (EINVAL):
    /// flushing is all there is.
    pub async fn sync(&mut self) -> Result<(), SinkError> {
        let flushed = match &mut self.output {
            Output::Stdout(w) => w.flush(),
            Output::File(w, _) => w.flush(),
        };
        flushed.map_err(|e| self.io(e))?;
        if self.length.is_some() || self.stream_in_file {
            let file = match &self.output {
                Output::File(w, _) => w.get_ref().try_clone(),
                Output::Stdout(_) => stdout_file(),
            }
            .map_err(|e| self.io(e))?;
            tokio::task::spawn_blocking(move || file.sync_data())
                .await
                .map_err(|e| self.io(std::io::Error::other(e.to_string())))?
                .map_err(|e| self.io(e))?;
        }
        self.durable = self.length;
        self.durable_last_id = self.last_id;
        Ok(())
    }
}

/// fd 1 as a file of its own (a duplicate), to fsync where it is a regular file.
fn stdout_file() -> std::io::Result<File> {
    #[cfg(unix)]
    {
        use std::os::fd::AsFd as _;
        let fd = std::io::stdout().as_fd().try_clone_to_owned()?;
        Ok(File::from(fd))
    }
    #[cfg(not(unix))]
    {
        Err(std::io::Error::other(
            "fsync of standard output is not supported here",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(text: &str) -> OutgoingMessage {
        OutgoingMessage {
            topic: "t".into(),
            key: None,
            partition_hint: None,
            headers: Vec::new(),
            payload: text.as_bytes().to_vec(),
            message_id: None,
            tombstone: false,
        }
    }

    fn temp() -> PathBuf {
        std::env::temp_dir().join(format!("mssql-ces-sink-{}", uuid::Uuid::new_v4()))
    }

    /// A file another process writes (its lock held) is refused before anything is
    /// cut; once that process is gone, it opens.
    #[test]
    fn a_file_another_process_writes_is_refused_before_anything_is_cut() {
        let path = temp();
        std::fs::write(&path, "{\"a\":1}\n{\"torn\":").unwrap();
        let holder = File::open(&path).unwrap();
        holder.lock().unwrap();
        let err = StreamSink::file(path.clone(), Encoding::Json, Resume::At(8))
            .err()
            .expect("locked by another writer");
        assert!(err.to_string().contains("another process"), "{err}");
        assert!(!err.is_transient());
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "{\"a\":1}\n{\"torn\":",
            "untouched"
        );
        drop(holder);
        let sink = StreamSink::file(path.clone(), Encoding::Json, Resume::At(8)).unwrap();
        assert_eq!(sink.durable_length(), Some(8));
        std::fs::remove_file(&path).ok();
    }

    /// A batch's end writes and fsyncs on a blocking thread; what it covers is then
    /// durable and its length recorded for the checkpoint.
    #[tokio::test]
    async fn the_batch_end_syncs_off_the_async_workers() {
        let path = temp();
        let mut sink = StreamSink::file(path.clone(), Encoding::Json, Resume::Fresh).unwrap();
        sink.send(message("{\"a\":1}")).unwrap();
        assert_eq!(sink.durable_length(), Some(0), "not yet synced");
        sink.sync().await.unwrap();
        assert_eq!(sink.durable_length(), Some(8));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{\"a\":1}\n");
        std::fs::remove_file(&path).ok();
    }

    #[tokio::test]
    async fn a_restart_cuts_what_the_checkpoint_does_not_cover() {
        let path = temp();
        let mut sink = StreamSink::file(path.clone(), Encoding::Json, Resume::Fresh).unwrap();
        sink.send(message("{\"a\":1}")).unwrap();
        sink.sync().await.unwrap();
        let checkpointed = sink.durable_length().unwrap();
        assert_eq!(checkpointed, 8);
        // Written after the checkpoint, and a torn line from a kill.
        sink.send(message("{\"b\":2}")).unwrap();
        sink.sync().await.unwrap();
        drop(sink);
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b"{\"c\":").unwrap();
        drop(f);
        let mut sink =
            StreamSink::file(path.clone(), Encoding::Json, Resume::At(checkpointed)).unwrap();
        sink.send(message("{\"b\":2}")).unwrap();
        sink.sync().await.unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "{\"a\":1}\n{\"b\":2}\n"
        );
        assert_eq!(sink.durable_length(), Some(16));
        std::fs::remove_file(path).ok();
    }

    #[test]
    fn a_file_without_a_checkpoint_or_shorter_than_it_is_refused() {
        let path = temp();
        std::fs::write(&path, "old\n").unwrap();
        let err = StreamSink::file(path.clone(), Encoding::Json, Resume::Fresh)
            .err()
            .unwrap();
        assert!(err.to_string().contains("no checkpoint"), "{err}");
        let err = StreamSink::file(path.clone(), Encoding::Json, Resume::At(100))
            .err()
            .unwrap();
        assert!(err.to_string().contains("fewer than"), "{err}");
        let sink = StreamSink::file(path.clone(), Encoding::Json, Resume::Unknown).unwrap();
        assert_eq!(sink.durable_length(), Some(4));
        std::fs::remove_file(path).ok();
    }

    fn event(id: uuid::Uuid, text: &str) -> OutgoingMessage {
        OutgoingMessage {
            payload: format!("{{\"id\":\"{id}\",\"data\":\"{text}\"}}").into_bytes(),
            message_id: Some(id),
            tombstone: false,
            ..message("")
        }
    }

    /// The checkpoint names the file and its last event; a start checks both
    /// before it cuts anything, and accepts the same file under another path.
    #[tokio::test]
    async fn the_checkpoint_names_the_file_and_a_start_checks_it_before_cutting() {
        let path = temp();
        let mut sink = StreamSink::file(path.clone(), Encoding::Json, Resume::Fresh).unwrap();
        assert_eq!(
            sink.durable_file(),
            Some(SinkFile {
                path: absolute(&path),
                last_id: None
            }),
            "an empty file has no last event"
        );
        let (first, second) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
        sink.send(event(first, "a")).unwrap();
        sink.send(event(second, "b")).unwrap();
        sink.sync().await.unwrap();
        let length = sink.durable_length().unwrap();
        let file = sink.durable_file().unwrap();
        assert_eq!(file.last_id, Some(second));
        assert_eq!(file.path, absolute(&path));
        // Sent after the checkpoint, not yet synced: not what the checkpoint names.
        sink.send(event(uuid::Uuid::new_v4(), "c")).unwrap();
        assert_eq!(sink.durable_file().unwrap().last_id, Some(second));
        sink.sync().await.unwrap();
        drop(sink);
        let resume = Resume::Checked {
            length,
            file: file.clone(),
        };
        // A length that does not end a line is no checkpoint of ours, even where the
        // event's id stands before it.
        assert!(verify_file(&path, length - 1, &file).is_err());
        assert!(verify_file(&path, length, &file).is_ok());

        // Another file, long enough, is refused untouched.
        let other = temp();
        let foreign = "x".repeat(length as usize * 2) + "\n";
        std::fs::write(&other, &foreign).unwrap();
        let err = StreamSink::file(other.clone(), Encoding::Json, resume.clone())
            .err()
            .expect("not the checkpoint's file");
        let text = err.to_string();
        assert!(
            text.contains("not the file the checkpoint was written for")
                && text.contains(&file.path)
                && text.contains(&second.to_string()),
            "{text}"
        );
        assert_eq!(
            std::fs::read_to_string(&other).unwrap(),
            foreign,
            "untouched"
        );
        // One too short names the file the checkpoint was written for.
        std::fs::write(&other, "short\n").unwrap();
        let err = StreamSink::file(other.clone(), Encoding::Json, resume.clone())
            .err()
            .unwrap();
        assert!(err.to_string().contains(&file.path), "{err}");

        // A copy of the file under another path (a shared mount seen elsewhere) is
        // the same file.
        std::fs::copy(&path, &other).unwrap();
        let copy = StreamSink::file(other.clone(), Encoding::Json, resume.clone()).unwrap();
        assert_eq!(copy.durable_length(), Some(length));
        assert_eq!(copy.durable_file().unwrap().last_id, Some(second));
        drop(copy);

        // The file itself: cut back to the checkpoint.
        let sink = StreamSink::file(path.clone(), Encoding::Json, resume.clone()).unwrap();
        assert_eq!(sink.durable_length(), Some(length));
        assert_eq!(std::fs::metadata(&path).unwrap().len(), length);
        drop(sink);
        // A copy of exactly the checkpoint's length, elsewhere: the same file too.
        std::fs::copy(&path, &other).unwrap();
        let copy = StreamSink::file(other.clone(), Encoding::Json, resume).unwrap();
        assert_eq!(copy.durable_length(), Some(length));
        std::fs::remove_file(path).ok();
        std::fs::remove_file(other).ok();
    }

    /// Avro lines are base64: the id is looked for in the decoded bytes.
    #[tokio::test]
    async fn an_avro_files_last_event_is_found_in_its_decoded_line() {
        let path = temp();
        let mut sink = StreamSink::file(path.clone(), Encoding::Avro, Resume::Fresh).unwrap();
        let id = uuid::Uuid::new_v4();
        // A line before it: the last line is found exactly (a newline or a byte of
        // the line before would not decode).
        sink.send(event(uuid::Uuid::new_v4(), "before")).unwrap();
        sink.send(event(id, "binary")).unwrap();
        sink.sync().await.unwrap();
        let resume = Resume::Checked {
            length: sink.durable_length().unwrap(),
            file: sink.durable_file().unwrap(),
        };
        drop(sink);
        assert!(
            !std::fs::read_to_string(&path)
                .unwrap()
                .contains(&id.to_string())
        );
        StreamSink::file(path.clone(), Encoding::Avro, resume.clone()).expect("the same file");
        let Resume::Checked { length, mut file } = resume else {
            unreachable!()
        };
        file.last_id = Some(uuid::Uuid::new_v4());
        assert!(verify_file(&path, length, &file).is_err());
        // A length that does not end a line is no checkpoint of ours.
        file.last_id = Some(id);
        assert!(verify_file(&path, length - 1, &file).is_err());
        assert!(verify_file(&path, length, &file).is_ok());
        std::fs::remove_file(path).ok();
    }

    #[tokio::test]
    async fn a_path_that_is_not_a_regular_file_is_a_stream() {
        let mut sink =
            StreamSink::file(PathBuf::from("/dev/null"), Encoding::Json, Resume::At(5)).unwrap();
        sink.send(message("x")).unwrap();
        sink.sync().await.expect("no fsync on a character device");
        assert_eq!(sink.durable_length(), None);
    }
}
