//! The `waitroom` binary: parse the command line, set up telemetry, run.

#![forbid(unsafe_code)]
// No `.unwrap()` outside tests: a panic in a request is a 500 (test modules may unwrap).
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

use anyhow::Context as _;
use clap::Parser as _;
use waitroom::booking::consumer;
use waitroom::booking::producer::ensure_topic;
use waitroom::config::{Cli, Command};
use waitroom::startup::{migrate, shutdown_on_signals, Application, Services};

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
            migrate(&pool).await.context("running migrations")?;
            println!("migrations applied");
            Ok(())
        }
        Command::Healthcheck { url } => healthcheck(&url).await,
        Command::Admin(args) => waitroom::admin_cli::run(*args).await,
        Command::Ledger(config) => {
            let (_, secret) = config.secrets()?;
            let services = Services::connect(&config, &secret).await?;
            migrate(services.db())
                .await
                .context("running migrations before the ledger starts")?;
            // The topic too, so the ledger subscribes to a topic that exists. Not fatal: a
            // broker whose ACLs refuse this user CreateTopics may still hold the topic, and a
            // topic made later is found by the ledger's metadata refresh within seconds
            // (`consumer::METADATA_REFRESH_MS`).
            if let Err(e) = ensure_topic(&config.kafka).await {
                tracing::warn!(error = %e, "could not create the bookings topic; the ledger subscribes anyway");
            }
            consumer::Ledger::new(&config, services.bookings)?
                .run(shutdown_on_signals())
                .await
        }
        Command::Reconcile(args) => {
            let (_, secret) = args.config.secrets()?;
            let services = Services::connect(&args.config, &secret).await?;
            let drift = services
                .bookings
                .reconcile(args.repair, &args.config.kafka)
                .await?;
            for d in &drift {
                println!("{}", serde_json::to_string(d)?);
            }
            let left = drift
                .iter()
                .filter(|d| d.action.starts_with("left"))
                .count();
            eprintln!(
                "{} seats drifting between Redis and PostgreSQL; {} {}, {left} left to the ledger and the sweeper (see each line's action)",
                drift.len(),
                drift.len() - left,
                if args.repair { "repaired" } else { "would be repaired by --repair" },
            );
            anyhow::ensure!(
                !(args.repair && left > 0),
                "--repair left {left} seats: their bookings may still be decided; run reconcile again once the ledger has caught up"
            );
            Ok(())
        }
    }
}

/// GET of `<url>/healthz` with a 5 s bound: exit 0 when it answers 200.
async fn healthcheck(url: &str) -> anyhow::Result<()> {
    let resp = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(5))
        .build()?
        .get(format!("{}/healthz", url.trim_end_matches('/')))
        .send()
        .await
        .with_context(|| format!("asking {url} for /healthz"))?;
    anyhow::ensure!(resp.status().is_success(), "unhealthy: {}", resp.status());
    println!("healthy");
    Ok(())
}
