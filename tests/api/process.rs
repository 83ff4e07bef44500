//! `orderpay serve` as a real subprocess, for tests that kill it (SIGKILL) mid-request.

use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_orderpay");

pub struct ServiceProcess {
    child: Child,
    pub address: String,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl ServiceProcess {
    /// Starts `orderpay serve` on a free port against `database_url` and `provider_url`, with
    /// `env` on top of quiet defaults (reconciler off), and waits until it answers `/healthz`.
    pub async fn start(database_url: &str, provider_url: &str, env: &[(&str, &str)]) -> ServiceProcess {
        Self::start_logging_to(database_url, provider_url, env, None).await
    }

    /// As [`ServiceProcess::start`], with the service's stderr (its logs) written to `log`.
    pub async fn start_logging_to(
        database_url: &str,
        provider_url: &str,
        env: &[(&str, &str)],
        log: Option<&Path>,
    ) -> ServiceProcess {
        // A caller may fix the address (to restart on the same one); else a free port.
        let listen = env
            .iter()
            .find(|(name, _)| *name == "ORDERPAY_LISTEN")
            .map(|(_, value)| value.to_string())
            .unwrap_or_else(|| format!("127.0.0.1:{}", free_port()));
        let port = listen.rsplit(':').next().unwrap().to_owned();
        let mut command = Command::new(BIN);
        command
            .arg("serve")
            .env("DATABASE_URL", database_url)
            .env("ORDERPAY_LISTEN", &listen)
            .env("ORDERPAY_PROVIDER_URL", provider_url)
            .env("ORDERPAY_WORKERS", "1")
            .env("ORDERPAY_RECONCILE_INTERVAL_MS", "3600000")
            .env("ORDERPAY_RATE_LIMIT_PER_SEC", "0")
            .env("RUST_LOG", std::env::var("TEST_LOG").map_or("warn".to_owned(), |_| "info".to_owned()))
            .stdout(Stdio::null());
        for (name, value) in env {
            command.env(name, value);
        }
        if let Some(log) = log {
            command.stderr(std::fs::File::create(log).expect("log file"));
        }
        let child = command.spawn().expect("orderpay serve starts");
        let mut process = ServiceProcess { child, address: format!("http://127.0.0.1:{port}") };
        let client = crate::helpers::http_client();
        for _ in 0..200 {
            if client.get(format!("{}/healthz", process.address)).send().await.is_ok() {
                // What answered must be this process: one that could not bind the port exits,
                // and a test would go on against whatever else listens there.
                tokio::time::sleep(Duration::from_millis(50)).await;
                if let Ok(Some(status)) = process.child.try_wait() {
                    panic!("orderpay serve exited ({status}) while something else answers on port {port}");
                }
                return process;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("orderpay serve did not come up on port {port}");
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGTERM: the orderly stop an orchestrator sends.
    pub fn terminate(&self) {
        let status = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        assert!(status.is_ok_and(|status| status.success()), "kill -TERM failed");
    }

    /// Waits for the process to exit on its own, up to `limit`.
    pub async fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }

    /// SIGKILL: no shutdown code runs, like a crash or a lost machine.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ServiceProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A "provider" that accepts connections and never answers: requests to it hang until the
/// caller gives up, and it never charges anything.
pub fn black_hole() -> (std::net::TcpListener, String) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    (listener, address)
}
