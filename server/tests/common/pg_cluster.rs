//! Private PostgreSQL clusters for tests: initdb in a temp directory under /tmp, its own port,
//! trust authentication on 127.0.0.1, run as the postgres user when the tests run as root.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

/// Where PostgreSQL's server binaries are: `SEPP_TEST_PG_BIN`, else the newest
/// `/usr/lib/postgresql/*/bin` with an `initdb`, else `pg_config --bindir`.
pub fn pg_bin() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("SEPP_TEST_PG_BIN") {
        return Some(PathBuf::from(p)).filter(|p| p.join("initdb").exists());
    }
    let mut dirs: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse().ok()?;
            Some((v, e.path().join("bin")))
        })
        .filter(|(_, p)| p.join("initdb").exists())
        .collect();
    dirs.sort();
    if let Some((_, p)) = dirs.pop() {
        return Some(p);
    }
    let out = Command::new("pg_config").arg("--bindir").output().ok()?;
    let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    p.join("initdb").exists().then_some(p)
}

/// Why the private-cluster tests cannot run here, if they cannot.
pub fn cannot_run_clusters() -> Option<String> {
    if pg_bin().is_none() {
        return Some("PostgreSQL's initdb is not installed (set SEPP_TEST_PG_BIN)".into());
    }
    if is_root()
        && !Command::new("id")
            .args(["-u", "postgres"])
            .output()
            .is_ok_and(|o| o.status.success())
    {
        return Some("running as root and there is no postgres user to run initdb as".into());
    }
    None
}

pub fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// A PostgreSQL cluster of its own: initdb in a temp directory, its own port, trust
/// authentication on 127.0.0.1. Stopped (immediate) and removed when dropped.
pub struct Cluster {
    pub bin: PathBuf,
    pub root: PathBuf,
    pub port: u16,
}

impl Cluster {
    pub fn data(&self) -> PathBuf {
        self.root.join("data")
    }

    /// `prog` of the server binaries, as the postgres user when running as root.
    pub fn command(&self, prog: &str) -> Command {
        let path = self.bin.join(prog);
        if is_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(path);
            c
        } else {
            Command::new(path)
        }
    }

    pub fn run(&self, mut c: Command, what: &str) {
        let out = c.output().unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(
            out.status.success(),
            "{what} failed ({}): {}{}\nserver log:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.log_tail()
        );
    }

    /// A directory for a new cluster (owned by postgres when running as root).
    pub fn empty(bin: &Path) -> Cluster {
        static N: AtomicU64 = AtomicU64::new(0);
        // Under /tmp, not $TMPDIR: the postgres user must reach it.
        let root = Path::new("/tmp").join(format!(
            "sepp-pg-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&root).expect("cluster directory");
        let c = Cluster {
            bin: bin.to_path_buf(),
            root,
            port: free_port(),
        };
        if is_root() {
            let out = Command::new("chown")
                .args(["postgres:postgres"])
                .arg(&c.root)
                .output()
                .expect("chown");
            assert!(out.status.success(), "chown: {out:?}");
        }
        c
    }

    /// initdb and start a new primary.
    pub fn primary(bin: &Path) -> Cluster {
        Cluster::primary_with(bin, |_| {})
    }

    /// initdb, `setup` (to write files into the data directory, e.g. with
    /// [`Cluster::write_file`]), then start a new primary.
    pub fn primary_with(bin: &Path, setup: impl FnOnce(&Cluster)) -> Cluster {
        let c = Cluster::empty(bin);
        let mut init = c.command("initdb");
        init.args(["-A", "trust", "-U", "postgres", "--no-sync", "-D"])
            .arg(c.data());
        c.run(init, "initdb");
        setup(&c);
        c.start();
        c
    }

    /// Writes `name` in the data directory, mode 0600, owned by postgres when running as root.
    pub fn write_file(&self, name: &str, contents: &[u8]) {
        use std::os::unix::fs::PermissionsExt as _;
        let path = self.data().join(name);
        std::fs::write(&path, contents).unwrap_or_else(|e| panic!("write {name}: {e}"));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .unwrap_or_else(|e| panic!("chmod {name}: {e}"));
        if is_root() {
            let out = Command::new("chown")
                .args(["postgres:postgres"])
                .arg(&path)
                .output()
                .expect("chown");
            assert!(out.status.success(), "chown: {out:?}");
        }
    }

    /// Appends `lines` to the cluster's postgresql.conf.
    pub fn configure(&self, lines: &str) {
        use std::io::Write as _;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(self.data().join("postgresql.conf"))
            .expect("postgresql.conf");
        writeln!(f, "{lines}").expect("postgresql.conf");
    }

    /// A hot standby of `primary`, streaming from it as `name` (pg_basebackup).
    pub fn standby_of(primary: &Cluster, name: &str) -> Cluster {
        let c = Cluster::empty(&primary.bin);
        let conninfo = format!(
            "host=127.0.0.1 port={} user=postgres application_name={name}",
            primary.port
        );
        let mut base = c.command("pg_basebackup");
        base.args([
            "-X",
            "stream",
            "-R",
            "-c",
            "fast",
            "--no-sync",
            "-d",
            &conninfo,
            "-D",
        ])
        .arg(c.data());
        c.run(base, "pg_basebackup");
        // -R wrote standby.signal and a primary_conninfo; this one names the standby for
        // synchronous_standby_names.
        let auto = c.data().join("postgresql.auto.conf");
        let mut text = std::fs::read_to_string(&auto).unwrap_or_default();
        text.push_str(&format!("primary_conninfo = '{conninfo}'\n"));
        std::fs::write(&auto, text).expect("postgresql.auto.conf");
        c.start();
        c
    }

    pub fn start(&self) {
        let opts = format!(
            "-c port={} -c listen_addresses=127.0.0.1 -c unix_socket_directories={} \
             -c max_connections=100 -c shared_buffers=32MB -c hot_standby=on",
            self.port,
            self.root.display()
        );
        let mut c = self.command("pg_ctl");
        c.args(["-w", "-t", "60", "-o", &opts, "-l"])
            .arg(self.root.join("log"))
            .arg("-D")
            .arg(self.data())
            .arg("start");
        self.run(c, "pg_ctl start");
    }

    /// Stops the postmaster at once, as a crash would (`pg_ctl stop -m immediate`).
    pub fn stop_hard(&self) {
        let mut c = self.command("pg_ctl");
        c.args(["-w", "-m", "immediate", "-D"])
            .arg(self.data())
            .arg("stop");
        self.run(c, "pg_ctl stop");
    }

    pub fn promote(&self) {
        let mut c = self.command("pg_ctl");
        c.args(["-w", "-t", "60", "-D"])
            .arg(self.data())
            .arg("promote");
        self.run(c, "pg_ctl promote");
    }

    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.root.join("log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    pub fn conninfo(&self, db: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname={db}",
            self.port
        )
    }

    pub async fn connect(&self, db: &str) -> tokio_postgres::Client {
        let (client, conn) = tokio_postgres::connect(&self.conninfo(db), tokio_postgres::NoTls)
            .await
            .unwrap_or_else(|e| panic!("connect to the cluster on port {}: {e}", self.port));
        tokio::spawn(async move {
            let _ = conn.await;
        });
        client
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.data().join("postmaster.pid").exists() {
            let _ = self
                .command("pg_ctl")
                .args(["-w", "-m", "immediate", "-D"])
                .arg(self.data())
                .arg("stop")
                .output();
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}
