//! Serves the synthetic workload over TDS on a loopback port, so `mssql-ces run` with
//! `kind = "sqlserver"` can be tried without SQL Server or docker.
//!
//! This is a **test double** that follows [MS-TDS] far enough for the driver the
//! daemon uses (crates/testkit/src/tds.rs), answering the daemon's own queries from the
//! synthetic workload (crates/testkit/src/tds_cdc.rs). It is not SQL Server: it parses no
//! SQL and knows only the daemon's queries.
//!
//! ```sh
//! cargo run --example tds_standin -- --port 14330 --transactions 1000 --existing-rows 10000
//! ```
//! (`--tls` offers TLS with a self-signed certificate made at start.)
//! then, in another shell, `examples/standin.toml`.

use mssql_ces_testkit::{tds, tds_cdc};

use mssql_ces::source::synthetic::{SyntheticConfig, SyntheticSource};

/// The login the stand-in accepts.
const USER: &str = "mssql_ces";
const PASSWORD: &str = "Ces_Poller_Passw0rd!";

fn main() {
    let mut port = 14330u16;
    let mut tls = false;
    let mut config = SyntheticConfig {
        transactions: Some(1000),
        ..SyntheticConfig::default()
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut number = || -> u64 {
            args.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| usage(&format!("{flag} needs a number")))
        };
        if flag == "--tls" {
            tls = true;
            continue;
        }
        if flag == "--help" || flag == "-h" {
            println!("{HELP}");
            return;
        }
        match flag.as_str() {
            "--port" => port = u16::try_from(number()).unwrap_or_else(|_| usage("bad --port")),
            "--seed" => config.seed = number(),
            "--transactions" => {
                config.transactions = Some(number()).filter(|&n| n > 0);
            }
            "--rate" => {
                config.rate_per_second = Some(number() as f64).filter(|&r| r > 0.0);
            }
            "--existing-rows" => config.existing_rows = number(),
            "--large-value-every" => config.large_value_every = number(),
            other => usage(&format!("unknown argument {other}")),
        }
    }
    let Ok(runtime) = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    else {
        eprintln!("cannot start the runtime");
        std::process::exit(1);
    };
    runtime.block_on(async move {
        let source = SyntheticSource::new(config).keep_history();
        let address = format!("127.0.0.1:{port}");
        let tls = if tls {
            match tds::self_signed_tls() {
                Ok(config) => Some(config),
                Err(e) => {
                    eprintln!("cannot make a certificate: {e}");
                    std::process::exit(1);
                }
            }
        } else {
            None
        };
        let encrypted = tls.is_some();
        let started = match tls {
            Some(config) => {
                tds::StandIn::start_tls_on(&address, USER, PASSWORD, tds_cdc::handler(source), config)
                    .await
            }
            None => tds::StandIn::start_on(&address, USER, PASSWORD, tds_cdc::handler(source)).await,
        };
        match started {
            Ok(standin) => {
                println!(
                    "TDS stand-in (a test double, not SQL Server) serving the synthetic workload on {}",
                    standin.address
                );
                let url = standin.connection_string(USER, "<password>");
                if encrypted {
                    println!(
                        "connection string: {} (TLS with a self-signed certificate: set source.encrypt = true and source.trust_server_certificate = true)",
                        url.replace(";Encrypt=false", "")
                    );
                } else {
                    println!("connection string: {url} (no TLS: set source.encrypt = false)");
                }
                println!("login {USER}, password {PASSWORD}; Ctrl-C to stop");
                let _ = tokio::signal::ctrl_c().await;
            }
            Err(e) => {
                eprintln!("cannot listen on {address}: {e}");
                std::process::exit(1);
            }
        }
    });
}

const HELP: &str = "\
Serves the synthetic workload over TDS on 127.0.0.1 (a test double, not SQL Server),
so that `mssql-ces run` with kind = \"sqlserver\" can be tried without a server.

usage: tds_standin [--port N] [--tls] [--seed N] [--transactions N] [--rate N]
                   [--existing-rows N] [--large-value-every N]

  --port N               listen on 127.0.0.1:N (default 14330)
  --tls                  offer TLS with a self-signed certificate made at start
  --seed N               the workload's seed (default 1)
  --transactions N       transactions to generate (default 1000; 0 endless)
  --rate N               transactions a second (default: as fast as read)
  --existing-rows N      rows of dbo.products before the stream starts (for a load)
  --large-value-every N  a 1.5 MiB value every N transactions (default none)

Then, in another shell: mssql-ces run --config examples/standin.toml";

fn usage(problem: &str) -> ! {
    eprintln!("{problem}\n\n{HELP}");
    std::process::exit(2);
}
