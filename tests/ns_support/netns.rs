//! Hosts made of Linux network namespaces: one namespace per host with its own IP on one
//! bridge (itself in a namespace of its own, so nothing of the machine's network is touched),
//! and one hosts file per namespace for name resolution.
//!
//! `ip netns exec NS` bind-mounts `/etc/netns/NS/hosts` over `/etc/hosts` for the command it
//! runs, so each host resolves names through its own file. The files are rewritten in place
//! (truncate and write): a bind mount pins the inode, so a renamed new file would never be seen.
//!
//! Everything made here (namespaces, their veth pairs, the `/etc/netns` directories) carries
//! the test process's PID in its name and is removed on drop, also when a test panics; what a
//! killed test process left behind is swept by the next run.

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

/// The domain of every host name (`chief-0.cohort-test`).
pub const DOMAIN: &str = "cohort-test";
/// Prefix of every namespace made here: `cohort-ns-<pid>-<n>-<host>`.
const PREFIX: &str = "cohort-ns-";

/// One host: its short name (`worker-1`), namespace and address (`None`: not published yet).
#[derive(Debug, Clone)]
struct Host {
    short: String,
    netns: String,
    ip: Option<String>,
    /// The address it has on its interface (kept while it is unpublished).
    assigned: String,
}

/// A set of hosts on one bridge; removed on drop.
pub struct Network {
    bridge_ns: String,
    hosts: Vec<Host>,
    /// Namespaces made so far (removed on drop, in reverse).
    made: Vec<String>,
}

/// Runs `ip ARGS`; the error names the command and what `ip` said.
fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("`ip {}`: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`ip {}`: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// The address of host `i` on the bridge's subnet.
pub fn address(i: usize) -> String {
    format!("10.77.0.{}", 10 + i)
}

impl Network {
    /// Hosts named `shorts` (each `<short>.cohort-test`, at `10.77.0.10`, `.11`, ...), every
    /// one published in every hosts file. `None`, after printing why, where namespaces cannot
    /// be made here (not root, no `ip`): the caller skips its test.
    pub fn create(shorts: &[&str]) -> Option<Network> {
        sweep_stale();
        static RUNS: AtomicU32 = AtomicU32::new(0);
        let run = format!(
            "{PREFIX}{}-{}",
            std::process::id(),
            RUNS.fetch_add(1, Ordering::SeqCst)
        );
        let mut net = Network {
            bridge_ns: format!("{run}-br"),
            hosts: Vec::new(),
            made: Vec::new(),
        };
        // The first namespace tells whether this machine lets us make any.
        if let Err(e) = ip(&["netns", "add", &net.bridge_ns]) {
            super::skip::skip(
                super::skip::Part::Netns,
                &format!(
                    "network namespaces cannot be made here ({e}); it needs root and iproute2"
                ),
            );
            return None;
        }
        net.made.push(net.bridge_ns.clone());
        let br = net.bridge_ns.clone();
        ip(&["-n", &br, "link", "add", "br0", "type", "bridge"]).expect("bridge");
        ip(&["-n", &br, "link", "set", "br0", "up"]).expect("bridge up");
        for (i, short) in shorts.iter().enumerate() {
            let netns = format!("{run}-{short}");
            ip(&["netns", "add", &netns]).expect("host namespace");
            net.made.push(netns.clone());
            let port = format!("v{i}");
            ip(&[
                "-n", &br, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns",
                &netns,
            ])
            .expect("veth pair");
            ip(&["-n", &br, "link", "set", &port, "master", "br0", "up"]).expect("bridge port");
            ip(&["-n", &netns, "link", "set", "lo", "up"]).expect("loopback");
            let ip_addr = address(i);
            ip(&[
                "-n",
                &netns,
                "addr",
                "add",
                &format!("{ip_addr}/24"),
                "dev",
                "eth0",
            ])
            .expect("address");
            ip(&["-n", &netns, "link", "set", "eth0", "up"]).expect("eth0 up");
            std::fs::create_dir_all(etc_dir(&netns)).expect("/etc/netns dir");
            net.hosts.push(Host {
                short: short.to_string(),
                netns,
                ip: Some(ip_addr.clone()),
                assigned: ip_addr,
            });
        }
        net.write_hosts_files();
        Some(net)
    }

    /// The namespace of host `short`.
    pub fn netns(&self, short: &str) -> &str {
        &self.host(short).netns
    }

    /// `short`'s full name.
    pub fn name(short: &str) -> String {
        format!("{short}.{DOMAIN}")
    }

    fn host(&self, short: &str) -> &Host {
        self.hosts
            .iter()
            .find(|h| h.short == short)
            .unwrap_or_else(|| panic!("no host {short}"))
    }

    fn host_mut(&mut self, short: &str) -> &mut Host {
        self.hosts
            .iter_mut()
            .find(|h| h.short == short)
            .unwrap_or_else(|| panic!("no host {short}"))
    }

    /// Takes `short`'s name out of every hosts file (as DNS before a pod exists): it does not
    /// resolve until [`Network::publish`].
    pub fn unpublish(&mut self, short: &str) {
        self.host_mut(short).ip = None;
        self.write_hosts_files();
    }

    /// Puts `short`'s name back into every hosts file at its address.
    pub fn publish(&mut self, short: &str) {
        let host = self.host_mut(short);
        host.ip = Some(host.assigned.clone());
        self.write_hosts_files();
    }

    /// Moves `short` to `new_ip` under the same name: its interface's address changes and every
    /// hosts file says so (in place).
    pub fn move_host(&mut self, short: &str, new_ip: &str) {
        let netns = self.netns(short).to_string();
        ip(&["-n", &netns, "addr", "flush", "dev", "eth0"]).expect("old address removed");
        ip(&[
            "-n",
            &netns,
            "addr",
            "add",
            &format!("{new_ip}/24"),
            "dev",
            "eth0",
        ])
        .expect("new address");
        let host = self.host_mut(short);
        host.assigned = new_ip.to_string();
        host.ip = Some(new_ip.to_string());
        self.write_hosts_files();
    }

    /// Rewrites every namespace's hosts file in place (truncate and write, same inode).
    fn write_hosts_files(&self) {
        let mut text = String::from("127.0.0.1 localhost\n::1 localhost\n");
        for host in &self.hosts {
            if let Some(ip) = &host.ip {
                text.push_str(&format!("{ip} {}\n", Self::name(&host.short)));
            }
        }
        for host in &self.hosts {
            let path = etc_dir(&host.netns).join("hosts");
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .write(true)
                .truncate(true)
                .open(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            file.write_all(text.as_bytes())
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        }
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        for netns in self.made.iter().rev() {
            remove(netns);
        }
    }
}

fn etc_dir(netns: &str) -> std::path::PathBuf {
    std::path::Path::new("/etc/netns").join(netns)
}

/// Removes a namespace (its veth pair goes with it) and its `/etc/netns` directory.
fn remove(netns: &str) {
    if let Err(e) = ip(&["netns", "del", netns]) {
        eprintln!("[ns] could not remove namespace {netns}: {e}");
    }
    let _ = std::fs::remove_dir_all(etc_dir(netns));
}

/// Removes what earlier test processes that no longer exist left behind (killed before their
/// drops ran): namespaces named `cohort-ns-<pid>-...` whose PID is gone.
fn sweep_stale() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        let Some(pid) = name
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            remove(name);
        }
    }
}
