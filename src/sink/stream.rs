//! stdout and file sinks: newline-delimited events, for trying mssql-ces out and for
//! debugging without a broker.
//!
//! JSON messages are written as they are (the encoder escapes every newline, so a
//! message is one line); Avro messages as one base64 line each. A file is flushed and
//! fsynced at the end of every batch, before any checkpoint that covers the batch.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::PathBuf;

use base64::Engine as _;

use super::{Delivery, OutgoingMessage, SinkError};
use crate::event::Encoding;

enum Output {
    Stdout(BufWriter<std::io::Stdout>),
    File(BufWriter<File>, PathBuf),
}

pub struct StreamSink {
    output: Output,
    encoding: Encoding,
}

impl StreamSink {
    pub fn stdout(encoding: Encoding) -> Self {
        StreamSink {
            output: Output::Stdout(BufWriter::new(std::io::stdout())),
            encoding,
        }
    }

    /// Appends to `path`, creating it.
    pub fn file(path: PathBuf, encoding: Encoding) -> Result<Self, SinkError> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| SinkError::Io {
                path: path.display().to_string(),
                reason: e.to_string(),
            })?;
        Ok(StreamSink {
            output: Output::File(BufWriter::new(file), path),
            encoding,
        })
    }

    fn io(&self, e: std::io::Error) -> SinkError {
        let path = match &self.output {
            Output::Stdout(_) => "stdout".to_owned(),
            Output::File(_, p) => p.display().to_string(),
        };
        SinkError::Io {
            path,
            reason: e.to_string(),
        }
    }

    pub fn send(&mut self, message: OutgoingMessage) -> Result<Delivery, SinkError> {
        let line = match self.encoding {
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
        Ok(Delivery::Settled(Ok(())))
    }

    /// Flushes, and for a file, fsyncs.
    pub fn sync(&mut self) -> Result<(), SinkError> {
        let result = match &mut self.output {
            Output::Stdout(w) => w.flush(),
            Output::File(w, _) => w.flush().and_then(|()| w.get_ref().sync_data()),
        };
        result.map_err(|e| self.io(e))
    }
}
