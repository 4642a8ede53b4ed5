//! Faults of the process group with real processes: three `cohort collective-member`
//! processes all-reduce 4 MiB round after round over QUIC on 127.0.0.1.
//!
//! - A member SIGKILLed mid-collective: every survivor fails with `MemberLost` naming it (the
//!   transport's idle timeout, 800 ms here, is what detects it: the operation timeout is 60 s,
//!   so a survivor that waited for it would report `peer-timeout` instead), then the survivors
//!   re-form at generation 2 and go on.
//! - A member SIGSTOPped past the budget, then SIGCONTed: the survivors re-formed at generation 2
//!   without it; its own messages (its join of a group with a survivor) are refused by generation
//!   (EPOCH-1), and the survivors' sums never include it.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use cohort_transport::{ClusterCa, NodeId};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// Bound on every wait for a member's line.
const WAIT_MAX: Duration = Duration::from_secs(60);

/// One member process; killed (by its own PID) when the test ends either way.
struct Member {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Member {
    fn signal(&self, signal: Signal) {
        kill(Pid::from_raw(self.child.id() as i32), signal).unwrap();
    }

    /// Closes stdin: the member stops after its current round.
    fn stop(&mut self) {
        self.stdin.take();
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Group {
    members: Vec<Member>,
    lines: mpsc::Receiver<(usize, String)>,
    seen: Vec<Vec<String>>,
    dir: PathBuf,
}

impl Group {
    fn start(n: u32, name: &str) -> Group {
        Group::start_with(n, name, &[])
    }

    /// [`Group::start`], every member given `flags` too.
    fn start_with(n: u32, name: &str, flags: &[&str]) -> Group {
        let dir = std::env::temp_dir().join(format!("cohort-{name}-{}", std::process::id()));
        let ca = ClusterCa::generate(name).unwrap();
        let nodes: Vec<NodeId> = (0..n).map(|i| NodeId::new("worker", i)).collect();
        for node in &nodes {
            ca.issue(node).unwrap().save(&dir).unwrap();
        }
        // Free ports: bound then released once all are picked (a port released at once
        // could be picked twice); the members bind them right after.
        let held: Vec<std::net::UdpSocket> = nodes
            .iter()
            .map(|_| std::net::UdpSocket::bind("127.0.0.1:0").unwrap())
            .collect();
        let addrs: Vec<String> = held
            .iter()
            .map(|socket| socket.local_addr().unwrap().to_string())
            .collect();
        drop(held);
        let spec: Vec<String> = nodes
            .iter()
            .zip(&addrs)
            .map(|(n, a)| format!("{n}={a}"))
            .collect();
        let (tx, lines) = mpsc::channel();
        let mut members = Vec::new();
        for (i, node) in nodes.iter().enumerate() {
            let mut child = Command::new(env!("CARGO_BIN_EXE_cohort"))
                .args(["collective-member", "--node", &node.to_string()])
                .arg("--certs")
                .arg(&dir)
                .args(["--listen", &addrs[i], "--members", &spec.join(",")])
                .args(["--elements", "1048576", "--idle-timeout-ms", "800"])
                .args(flags)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .unwrap();
            let stdout = child.stdout.take().unwrap();
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    if tx.send((i, line)).is_err() {
                        break;
                    }
                }
            });
            let stdin = child.stdin.take();
            members.push(Member { child, stdin });
        }
        Group {
            members,
            lines,
            seen: vec![Vec::new(); n as usize],
            dir,
        }
    }

    /// Waits until member `i` prints a line containing `text`; returns it.
    fn wait_for(&mut self, i: usize, text: &str) -> String {
        let deadline = Instant::now() + WAIT_MAX;
        if let Some(line) = self.seen[i].iter().find(|l| l.contains(text)) {
            return line.clone();
        }
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok((from, line)) => {
                    self.seen[from].push(line.clone());
                    if from == i && line.contains(text) {
                        return line;
                    }
                }
                Err(_) => panic!(
                    "member {i} printed no {text:?} within {WAIT_MAX:?}; it printed {:?}",
                    self.seen[i]
                ),
            }
        }
    }

    /// Waits for member `i` to exit; returns its code.
    fn exit_code(&mut self, i: usize) -> i32 {
        let deadline = Instant::now() + WAIT_MAX;
        loop {
            if let Some(status) = self.members[i].child.try_wait().unwrap() {
                return status.code().unwrap_or(-1);
            }
            assert!(Instant::now() < deadline, "member {i} did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn drain(&mut self) {
        while let Ok((from, line)) = self.lines.try_recv() {
            self.seen[from].push(line);
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn a_member_sigkilled_mid_collective_fails_every_survivor_who_reform_and_go_on() {
    sigkilled_mid_collective(Group::start(3, "collective-kill"), false);
}

/// The same on the plaintext plane, whose members (one host) pass their chunks through shared
/// memory: the killed member's slots are no hang either, its TCP links' end tells.
#[test]
fn a_member_sigkilled_mid_collective_over_shared_memory_fails_every_survivor_who_go_on() {
    sigkilled_mid_collective(
        Group::start_with(3, "collective-kill-shm", &["--plaintext"]),
        true,
    );
}

/// Kills member 2 mid-collective; with `shared`, every member had passed chunks to its ring
/// successor through shared memory before.
fn sigkilled_mid_collective(mut g: Group, shared: bool) {
    for i in 0..3 {
        let line = g.wait_for(i, "ok generation=1 round=2");
        assert_eq!(
            line.contains("shared-memory-peers=0"),
            !shared,
            "member {i}: {line}"
        );
    }
    g.members[2].signal(Signal::SIGKILL);
    for i in 0..2 {
        let error = g.wait_for(i, "error generation=1");
        assert!(
            error.contains("kind=member-lost node=worker/2"),
            "survivor {i}: {error}"
        );
        let formed = g.wait_for(i, "formed generation=2");
        assert!(formed.contains("members=[worker/0,worker/1]"), "{formed}");
        g.wait_for(i, "ok generation=2 round=3");
    }
    g.drain();
    for i in 0..2 {
        assert!(
            !g.seen[i].iter().any(|l| l.contains("wrong sum")),
            "survivor {i}: {:?}",
            g.seen[i]
        );
    }
    for i in 0..2 {
        g.members[i].stop();
    }
    for i in 0..2 {
        assert_eq!(g.exit_code(i), 0, "survivor {i}: {:?}", g.seen[i]);
    }
}

#[test]
fn a_member_stopped_past_the_budget_is_refused_by_epoch_when_it_wakes() {
    stopped_past_the_budget(Group::start(3, "collective-stop"));
}

/// The same on the plaintext plane with shared memory: what the late member writes into its
/// slots when it wakes reaches no one (the survivors let go of its segment with generation 1).
#[test]
fn a_member_stopped_past_the_budget_over_shared_memory_is_refused_by_epoch_when_it_wakes() {
    stopped_past_the_budget(Group::start_with(
        3,
        "collective-stop-shm",
        &["--plaintext"],
    ));
}

fn stopped_past_the_budget(mut g: Group) {
    for i in 0..3 {
        g.wait_for(i, "ok generation=1 round=2");
    }
    g.members[2].signal(Signal::SIGSTOP);
    for i in 0..2 {
        let error = g.wait_for(i, "error generation=1");
        assert!(
            error.contains("kind=member-lost node=worker/2"),
            "survivor {i}: {error}"
        );
        g.wait_for(i, "ok generation=2 round=2");
    }
    g.members[2].signal(Signal::SIGCONT);
    // The late member finds its links gone, tries a group with a survivor at generation 2 and is
    // refused: the survivor's generation 2 was formed without it.
    let refused = g.wait_for(2, "kind=generation-refused");
    assert!(refused.contains("it is at generation 2"), "{refused}");
    assert_eq!(g.exit_code(2), 3, "{:?}", g.seen[2]);
    // The survivors went on at generation 2 throughout, their sums never mixing the late member in.
    for i in 0..2 {
        let before = g.wait_for(i, "ok generation=2 round=").clone();
        let next_round: u64 = before.rsplit('=').next().unwrap().parse::<u64>().unwrap() + 3;
        g.wait_for(i, &format!("ok generation=2 round={next_round}"));
    }
    g.drain();
    for i in 0..2 {
        assert!(
            !g.seen[i]
                .iter()
                .any(|l| l.contains("wrong sum") || l.contains("generation=3")),
            "survivor {i}: {:?}",
            g.seen[i]
        );
    }
    // (Whichever stops first is lost to the other, who may re-form alone before stopping.)
    for i in 0..2 {
        g.members[i].stop();
    }
    for i in 0..2 {
        assert_eq!(g.exit_code(i), 0, "survivor {i}: {:?}", g.seen[i]);
    }
}
