//! A private PostgreSQL cluster for the failover tests: a primary and a synchronous standby on
//! free ports of this machine, their data under a temporary directory, started with the server
//! binaries installed here (never the shared server on 5432). Dropping the cluster kills every
//! one of its processes (SIGKILL works on stopped ones too) and removes the directory, whether
//! the test passed or not.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The Debian snakeoil certificate: when it is here, the cluster serves TLS with it.
const SNAKEOIL_CERT: &str = "/etc/ssl/certs/ssl-cert-snakeoil.pem";
const SNAKEOIL_KEY: &str = "/etc/ssl/private/ssl-cert-snakeoil.key";

pub struct Node {
    pub name: &'static str,
    pub port: u16,
    pub data: PathBuf,
}

pub struct Cluster {
    root: PathBuf,
    bin: PathBuf,
    /// `initdb` refuses to run as root: commands then run as the `postgres` user.
    as_postgres: bool,
    /// Whether the servers accept TLS (the snakeoil certificate was found).
    pub tls: bool,
    pub primary: Node,
    pub standby: Node,
    /// Every server process seen: killed on drop even if its postmaster is gone.
    seen: Mutex<Vec<u32>>,
}

/// The directory holding `initdb`, `pg_ctl`, `pg_basebackup` and `postgres`: `PG_BINDIR`,
/// else `pg_config --bindir`, else the newest `/usr/lib/postgresql/*/bin`.
pub fn server_binaries() -> Option<PathBuf> {
    let complete =
        |dir: &Path| ["initdb", "pg_ctl", "pg_basebackup", "postgres"].iter().all(|b| dir.join(b).is_file());
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(dir) = std::env::var_os("PG_BINDIR") {
        candidates.push(dir.into());
    }
    if let Ok(output) = Command::new("pg_config").arg("--bindir").output() {
        candidates.push(String::from_utf8_lossy(&output.stdout).trim().into());
    }
    let mut installed: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|entries| entries.filter_map(|entry| entry.ok()).map(|entry| entry.path().join("bin")).collect())
        .unwrap_or_default();
    installed.sort_by_key(|dir| {
        dir.parent().and_then(|v| v.file_name()).and_then(|v| v.to_str()).and_then(|v| v.parse::<u32>().ok())
    });
    candidates.extend(installed.into_iter().rev());
    candidates.into_iter().find(|dir| complete(dir))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn running_as_root() -> bool {
    Command::new("id").arg("-u").output().is_ok_and(|output| output.stdout.starts_with(b"0\n"))
}

fn check(output: std::io::Result<Output>, what: &str) -> Output {
    let output = output.unwrap_or_else(|error| panic!("{what}: {error}"));
    assert!(
        output.status.success(),
        "{what} failed: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// `(pid, parent pid)` of every process, from /proc.
fn processes() -> Vec<(u32, u32)> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // "pid (comm) state ppid ...": comm may hold spaces and parentheses.
            let after_comm = &stat[stat.rfind(')')? + 1..];
            let ppid = after_comm.split_whitespace().nth(1)?.parse().ok()?;
            Some((pid, ppid))
        })
        .collect()
}

/// Whether `pid` is still a PostgreSQL server process (and not a pid reused since).
fn is_server_process(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| {
        let first = cmdline.split(|&b| b == 0).next().unwrap_or_default();
        String::from_utf8_lossy(first).contains("postgres")
    })
}

fn signal(pid: u32, name: &str) {
    let _ = Command::new("kill").args([&format!("-{name}"), &pid.to_string()]).output();
}

impl Cluster {
    /// Creates and starts both servers and waits until the standby replicates synchronously.
    /// `None` (after saying why) when the server binaries are not installed.
    pub fn start() -> Option<Cluster> {
        let Some(bin) = server_binaries() else {
            println!(
                "SKIPPED: the PostgreSQL server binaries (initdb, pg_ctl, pg_basebackup) are not installed; \
                 install them (Debian: apt install postgresql) or set PG_BINDIR"
            );
            return None;
        };
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().subsec_nanos();
        let root = std::env::temp_dir().join(format!("orderpay-failover-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&root).unwrap();
        let as_postgres = running_as_root();
        let tls = Path::new(SNAKEOIL_CERT).is_file() && Path::new(SNAKEOIL_KEY).is_file();
        let cluster = Cluster {
            primary: Node { name: "primary", port: free_port(), data: root.join("primary") },
            standby: Node { name: "standby", port: free_port(), data: root.join("standby") },
            root,
            bin,
            as_postgres,
            tls,
            seen: Mutex::default(),
        };
        if as_postgres {
            check(Command::new("chown").args(["postgres:postgres"]).arg(&cluster.root).output(), "chown");
        }
        cluster.init_primary();
        cluster.start_node(&cluster.primary);
        cluster.clone_standby();
        cluster.start_node(&cluster.standby);
        cluster.wait_for_sync_replication();
        Some(cluster)
    }

    /// A server program, as the `postgres` user when we are root.
    fn command(&self, program: &str) -> Command {
        let path = self.bin.join(program);
        let mut command = if self.as_postgres {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(path);
            command
        } else {
            Command::new(path)
        };
        // The servers' user may not be able to read the test's working directory.
        command.current_dir(&self.root);
        command
    }

    fn init_primary(&self) {
        let data = &self.primary.data;
        check(
            self.command("initdb")
                .arg("-D")
                .arg(data)
                .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync"])
                .output(),
            "initdb",
        );
        let mut settings = format!(
            "\nlisten_addresses = '127.0.0.1'\nport = {port}\nunix_socket_directories = '{root}'\n\
             wal_level = replica\nmax_wal_senders = 5\nhot_standby = on\nmax_connections = 80\n\
             shared_buffers = 32MB\n\
             # Every commit waits until the standby has it: an acknowledged commit survives the primary.\n\
             synchronous_standby_names = '*'\nsynchronous_commit = on\n\
             # Test speed only: what is tested is replication, not the durability of one disk.\n\
             fsync = off\n",
            port = self.primary.port,
            root = self.root.display()
        );
        if self.tls {
            settings.push_str(&format!(
                "ssl = on\nssl_cert_file = '{SNAKEOIL_CERT}'\nssl_key_file = '{SNAKEOIL_KEY}'\n"
            ));
        }
        self.append(&data.join("postgresql.conf"), &settings);
    }

    fn clone_standby(&self) {
        check(
            self.command("pg_basebackup")
                .args(["-h", "127.0.0.1", "-p", &self.primary.port.to_string(), "-U", "postgres"])
                .arg("-D")
                .arg(&self.standby.data)
                .args(["-R", "-X", "stream", "-c", "fast", "--no-sync"])
                .output(),
            "pg_basebackup",
        );
        // Once promoted, the standby is alone: waiting for a standby of its own would block
        // every commit.
        let settings = format!("port = {}\nsynchronous_standby_names = ''\n", self.standby.port);
        self.append(&self.standby.data.join("postgresql.auto.conf"), &settings);
    }

    /// Appends to a file of a data directory (owned by `postgres`; we may be root or it).
    fn append(&self, file: &Path, text: &str) {
        use std::io::Write;
        let mut handle = std::fs::OpenOptions::new().append(true).open(file).unwrap();
        handle.write_all(text.as_bytes()).unwrap();
    }

    fn start_node(&self, node: &Node) {
        let log = self.root.join(format!("{}.log", node.name));
        check(
            self.command("pg_ctl")
                .arg("-D")
                .arg(&node.data)
                .arg("-l")
                .arg(&log)
                .args(["-w", "-t", "30", "start"])
                .output(),
            "pg_ctl start",
        );
        self.remember(node);
    }

    fn wait_for_sync_replication(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            let sync = self.psql(
                &self.primary,
                "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming' AND sync_state = 'sync'",
            );
            if sync.as_deref() == Some("1") {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("the standby did not replicate synchronously; see {}", self.root.display());
    }

    /// One value from `sql` on `node`, or `None` if the server does not answer.
    pub fn psql(&self, node: &Node, sql: &str) -> Option<String> {
        let output = Command::new(self.bin.join("psql"))
            .args(["-h", "127.0.0.1", "-p", &node.port.to_string(), "-U", "postgres", "-d", "postgres"])
            .args(["-Atqc", sql])
            .env("PGCONNECT_TIMEOUT", "2")
            .output()
            .ok()?;
        output.status.success().then(|| String::from_utf8_lossy(&output.stdout).trim().to_owned())
    }

    /// The failover URL: both hosts, the writable one chosen at connect.
    pub fn url(&self, database: &str) -> String {
        let sslmode = if self.tls { "require" } else { "prefer" };
        format!(
            "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/{database}?target_session_attrs=read-write&sslmode={sslmode}",
            self.primary.port, self.standby.port
        )
    }

    fn postmaster(&self, node: &Node) -> Option<u32> {
        let pidfile = std::fs::read_to_string(node.data.join("postmaster.pid")).ok()?;
        pidfile.lines().next()?.trim().parse().ok()
    }

    /// The node's postmaster and its children, remembered for the cleanup.
    fn remember(&self, node: &Node) -> Vec<u32> {
        let Some(postmaster) = self.postmaster(node) else { return Vec::new() };
        let mut pids = vec![postmaster];
        pids.extend(processes().into_iter().filter(|&(_, parent)| parent == postmaster).map(|(pid, _)| pid));
        self.seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).extend(&pids);
        pids
    }

    /// SIGKILL to the postmaster: the machine's PostgreSQL dies without a word. Its backends
    /// notice the postmaster's death and exit on their own.
    pub fn kill(&self, node: &Node) {
        let pids = self.remember(node);
        if let Some(&postmaster) = pids.first() {
            signal(postmaster, "KILL");
        }
    }

    /// SIGSTOP to the postmaster and every child: a frozen machine whose kernel still accepts
    /// and acknowledges TCP (keepalives included), and nothing answers.
    pub fn freeze(&self, node: &Node) {
        let pids = self.remember(node);
        for pid in pids {
            signal(pid, "STOP");
        }
        // Children forked in the meantime.
        for pid in self.remember(node) {
            signal(pid, "STOP");
        }
    }

    /// `pg_ctl promote`, waiting until the node takes writes.
    pub fn promote(&self, node: &Node) {
        check(
            self.command("pg_ctl").arg("-D").arg(&node.data).args(["-w", "-t", "30", "promote"]).output(),
            "pg_ctl promote",
        );
        self.remember(node);
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in [&self.primary, &self.standby] {
            self.remember(node);
        }
        let seen = self.seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
        let alive: Vec<u32> = seen.into_iter().filter(|&pid| is_server_process(pid)).collect();
        for &pid in &alive {
            signal(pid, "KILL");
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while alive.iter().any(|&pid| is_server_process(pid)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}
