//! The `waitroom` binary: parse the command line, set up telemetry, run.

#![forbid(unsafe_code)]

use anyhow::Context as _;
use clap::Parser as _;
use waitroom::booking::consumer;
use waitroom::config::{Cli, Command};
use waitroom::startup::{connect_sales, shutdown_on_signals, Application};

/// mimalloc instead of the system allocator: a profile of the service under load
/// (docs/benchmarks.md) spent a third of its user-space time in glibc malloc, free and memmove.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    waitroom::telemetry::init_tracing();
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(config) => {
            let app = Application::build(*config)
                .await
                .context("starting the service")?;
            tracing::info!(addr = %app.local_addr(), instance = %app.instance_id(), "waitroom listening");
            println!("waitroom listening on http://{}", app.local_addr());
            app.run_until_stopped(shutdown_on_signals()).await
        }
        Command::Migrate(db) => {
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(1)
                .connect(db.url.expose())
                .await
                .context("connecting to PostgreSQL")?;
            sqlx::migrate!("./migrations")
                .run(&pool)
                .await
                .context("running migrations")?;
            println!("migrations applied");
            Ok(())
        }
        Command::Healthcheck { url } => healthcheck(&url).await,
        Command::Ledger(config) => {
            let (_, secret) = config.secrets()?;
            let sales = connect_sales(&config, &secret).await?;
            consumer::run(
                config.kafka.clone(),
                sales.db.clone(),
                sales,
                shutdown_on_signals(),
            )
            .await
        }
        Command::Reconcile(args) => {
            let (_, secret) = args.config.secrets()?;
            let sales = connect_sales(&args.config, &secret).await?;
            let drift = sales.reconcile(args.repair).await?;
            for d in &drift {
                println!("{}", serde_json::to_string(d)?);
            }
            let verb = if args.repair { "repaired" } else { "found" };
            eprintln!(
                "{} seats drifting between Redis and PostgreSQL ({verb})",
                drift.len()
            );
            Ok(())
        }
        Command::Loadgen(args) => waitroom::bench::loadgen::run(*args).await.map(|_| ()),
        Command::LedgerBench(args) => waitroom::bench::ledger::run(*args).await.map(|_| ()),
        Command::OrderingBench(args) => waitroom::bench::ordering::run(args).await.map(|_| ()),
    }
}

/// Minimal HTTP/1.1 GET of /healthz, without pulling an HTTP client into the binary.
async fn healthcheck(url: &str) -> anyhow::Result<()> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let host = url.trim_start_matches("http://").trim_end_matches('/');
    let mut stream = tokio::net::TcpStream::connect(host)
        .await
        .with_context(|| format!("connecting to {host}"))?;
    stream
        .write_all(
            format!("GET /healthz HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await?;
    let mut buf = String::new();
    stream.read_to_string(&mut buf).await?;
    anyhow::ensure!(
        buf.starts_with("HTTP/1.1 200"),
        "unhealthy: {}",
        buf.lines().next().unwrap_or("")
    );
    println!("healthy");
    Ok(())
}
