//! The `mssql-ces` command line.

use clap::Parser;

/// SQL Server CDC to Change Event Streaming (CES) events.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {}

fn main() -> anyhow::Result<()> {
    let _cli = Cli::parse();
    println!("mssql-ces {}", env!("CARGO_PKG_VERSION"));
    Ok(())
}
