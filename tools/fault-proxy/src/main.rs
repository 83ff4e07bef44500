//! `fault-proxy`: the fault proxy as a program, for the TypeScript client's tests and the
//! checkout example. Prints `listening on 127.0.0.1:<port>` once it accepts connections.

use clap::Parser;
use orderpay_fault_proxy::{Fault, FaultProxy, Faults};

#[derive(Parser)]
#[command(about = "An HTTP fault proxy in front of orderpay (steered at /_faults on its own port)")]
struct Args {
    /// Where to listen (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: String,
    /// The service, `host:port`.
    #[arg(long)]
    upstream: String,
    /// The share of exchanges faulted, 0 to 1.
    #[arg(long, default_value_t = 0.0)]
    rate: f64,
    /// The kinds of faults, comma-separated: drop, reset, unavailable, delay (all by default).
    #[arg(long, value_delimiter = ',', value_parser = parse_fault)]
    kinds: Vec<Fault>,
    /// How long a delay waits before forwarding.
    #[arg(long, default_value_t = 300)]
    delay_ms: u64,
    /// The random sequence's seed (0: from the clock).
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

fn parse_fault(text: &str) -> Result<Fault, String> {
    serde_json::from_value(serde_json::Value::String(text.to_owned()))
        .map_err(|_| format!("{text:?} is not drop, reset, unavailable or delay"))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::io::Result<()> {
    let args = Args::parse();
    let faults = Faults {
        rate: args.rate,
        kinds: args.kinds,
        delay_ms: args.delay_ms,
        seed: args.seed,
        ..Faults::default()
    };
    let proxy = FaultProxy::start(&args.listen, &args.upstream, faults).await?;
    println!("listening on 127.0.0.1:{}", proxy.port);
    tokio::signal::ctrl_c().await?;
    Ok(())
}
