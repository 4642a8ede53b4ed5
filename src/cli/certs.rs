//! `cohort certs`: a cluster CA and one certificate per node, for a real cluster; and, with
//! `--k8s-secret`, the Kubernetes Secret that carries them to the pods.
//!
//! One directory serves every node: it holds `ca.pem` and `<type>-<index>.pem/.key` for every
//! task of the cluster, and each process loads the pair named by its own task (type and index
//! from its configuration: flags, environment, `TF_CONFIG`, `cohort.toml`). That is what a pod
//! template needs, where every replica of a type mounts the same volume. It is as strict as one
//! directory per node:
//! - each key still proves exactly one task identity: the certificate names `<type>-<index>`,
//!   a dialer checks that name against the task it meant to reach, and the receiver takes the
//!   sender's role and index from the certificate, never from what the peer says (SEC-2);
//! - a process loads only its own pair and refuses to start if that certificate names any
//!   other task, so a pod given the wrong index fails at once instead of posing as its peer;
//! - the CA key never leaves the machine that ran `cohort certs` (it is not in the Secret), so
//!   no pod can mint an identity; what the job's pods share is the set of identities the job
//!   already has, and the Secret (readable by the job's pods only) is that trust boundary.

use crate::process::stdout::outln;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use cohort_transport::{ClusterCa, NodeCredentials, NodeId, CA_FILE};

use super::CliError;
use crate::cluster::{ClusterConfig, ClusterSpec, TaskType};

/// Flags of `cohort certs`.
#[derive(Debug, clap::Args)]
pub struct CertsArgs {
    /// Directory to write the CA and node certificates into (created if missing).
    #[arg(long)]
    out: PathBuf,
    /// The cluster: counts such as `chief=1,ps=2,worker=2`, or a file with the cluster spec
    /// (a TF_CONFIG JSON file, or a cohort.toml with a [cluster] table).
    #[arg(long)]
    cluster: String,
    /// The cluster's name, written into the CA certificate.
    #[arg(long, default_value = "cohort")]
    name: String,
    /// Overwrite certificates already in --out (by default existing files are never replaced).
    #[arg(long, conflicts_with_all = ["add", "renew"])]
    force: bool,
    /// Sign certificates only for the nodes of --cluster that --out has none for yet, with the
    /// CA already there (its ca.pem and ca.key): the certificates of workers that will join a
    /// running job (`workers_max`). Nothing already in --out is replaced.
    #[arg(long, conflicts_with = "renew")]
    add: bool,
    /// Sign a new certificate and key for every node of --cluster with the CA already in --out
    /// (its ca.pem and ca.key), replacing theirs: certificate rotation. Running processes
    /// reload their pair within 10 s for the handshakes that follow, without a restart
    /// (connections already up keep theirs).
    #[arg(long)]
    renew: bool,
    /// Also write a Kubernetes Secret manifest called NAME to `<out>/NAME.secret.yaml`: ca.pem
    /// and every node's certificate and key (never ca.key), to mount as the certs directory
    /// (COHORT_CERTS) of every pod of the job.
    #[arg(long, value_name = "NAME")]
    k8s_secret: Option<String>,
    /// Days each node certificate is valid, from now (less an hour for clock skew). Renew
    /// before then: `cohort certs --renew` (same CA; running tasks reload the new files) or
    /// `--force` (a new CA: restart the job); an expired certificate is refused at the
    /// handshake.
    #[arg(long, default_value_t = 365, value_parser = clap::value_parser!(u32).range(1..=36_500))]
    pub valid_days: u32,
    /// Days the CA certificate is valid (a new CA only; with --add the CA in --out is kept).
    #[arg(long, default_value_t = 3650, value_parser = clap::value_parser!(u32).range(1..=36_500))]
    pub ca_valid_days: u32,
    /// The Secret's namespace (with --k8s-secret; default: the one it is applied to).
    #[arg(long, value_name = "NS", requires = "k8s_secret")]
    namespace: Option<String>,
}

/// `n` days.
fn days(n: u32) -> std::time::Duration {
    std::time::Duration::from_secs(u64::from(n) * 86_400)
}

/// Generates the CA and node certificates described by `args`.
pub fn run(args: CertsArgs) -> Result<(), CliError> {
    let nodes = nodes_of(&args.cluster)?;
    let secret = match &args.k8s_secret {
        Some(name) => Some(SecretTarget::new(name, args.namespace.as_deref())?),
        None => None,
    };
    if args.add || args.renew {
        return sign_with_existing_ca(&args, &nodes, secret.as_ref());
    }
    if !args.force {
        let existing: Vec<String> = std::iter::once(CA_FILE.to_string())
            .chain(nodes.iter().map(|n| format!("{}.pem", n.file_stem())))
            .chain(secret.as_ref().map(SecretTarget::file_name))
            .filter(|name| args.out.join(name).exists())
            .collect();
        if !existing.is_empty() {
            return Err(CliError::Usage(format!(
                "--out {}: {} already exist(s); pass --force to replace them",
                args.out.display(),
                existing.join(", ")
            )));
        }
    }
    if args.valid_days > args.ca_valid_days {
        return Err(CliError::Usage(format!(
            "--valid-days {}: longer than the CA's --ca-valid-days {}",
            args.valid_days, args.ca_valid_days
        )));
    }
    let ca = ClusterCa::generate_valid_for(&args.name, days(args.ca_valid_days))
        .map_err(|e| CliError::Failed(e.to_string()))?;
    let creds = nodes
        .iter()
        .map(|node| {
            ca.issue_valid_for(node, days(args.valid_days))
                .map_err(|e| CliError::Failed(format!("{node}: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    // Built before anything is written, so that a cluster too large for one Secret leaves
    // --out as it was.
    let manifest = secret
        .as_ref()
        .map(|target| target.manifest(ca.cert_pem(), &creds))
        .transpose()?;
    std::fs::create_dir_all(&args.out).map_err(|e| {
        CliError::Usage(format!("--out {}: cannot create it: {e}", args.out.display()))
    })?;
    for node in &creds {
        node.save(&args.out)
            .map_err(|e| CliError::Failed(e.to_string()))?;
    }
    write_secret_file(&args.out.join("ca.key"), ca.key_pem())?;
    outln!(
        "wrote a cluster CA and {} node certificate(s) to {}: ca.pem (share with every node), \
         ca.key (keep secret: it signs new nodes), and <role>-<index>.pem/.key per node",
        nodes.len(),
        args.out.display()
    );
    if let (Some(target), Some(manifest)) = (&secret, manifest) {
        let path = args.out.join(target.file_name());
        write_secret_file(&path, &manifest)?;
        outln!(
            "wrote the Kubernetes Secret {} to {} (every node's certificate and key, not \
             ca.key): `kubectl apply -f` it and mount it as the certs directory of every pod",
            target.name,
            path.display()
        );
    }
    Ok(())
}

/// `--add`: the nodes of `nodes` without a certificate in --out get one signed by the CA
/// there; `--renew`: every node of `nodes` gets a new one, replacing its pair. With `secret`,
/// the Secret is written again with every node's pair.
fn sign_with_existing_ca(
    args: &CertsArgs,
    nodes: &[NodeId],
    secret: Option<&SecretTarget>,
) -> Result<(), CliError> {
    let flag = if args.renew { "--renew" } else { "--add" };
    let read = |name: &str| {
        std::fs::read_to_string(args.out.join(name)).map_err(|e| {
            CliError::Usage(format!(
                "{flag} signs with the CA in --out {}, but {name} cannot be read there: {e}",
                args.out.display()
            ))
        })
    };
    let ca = ClusterCa::from_pem(&read(CA_FILE)?, &read("ca.key")?)
        .map_err(|e| CliError::Usage(format!("{flag}: the CA in {}: {e}", args.out.display())))?;
    let (have, missing): (Vec<&NodeId>, Vec<&NodeId>) = nodes.iter().partition(|n| {
        !args.renew && args.out.join(format!("{}.pem", n.file_stem())).exists()
    });
    let mut creds = Vec::new();
    for node in &have {
        creds.push(
            NodeCredentials::load(&args.out, node)
                .map_err(|e| CliError::Failed(format!("{node}: {e}")))?,
        );
    }
    let added = missing
        .iter()
        .map(|node| {
            ca.issue_valid_for(node, days(args.valid_days))
                .map_err(|e| CliError::Failed(format!("{node}: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    creds.extend(added.iter().cloned());
    let manifest = secret
        .map(|target| target.manifest(ca.cert_pem(), &creds))
        .transpose()?;
    for node in &added {
        node.save(&args.out)
            .map_err(|e| CliError::Failed(e.to_string()))?;
    }
    if args.renew {
        outln!(
            "renewed {} node certificate(s) in {} with its CA: running tasks reload them within \
             10 s for new connections",
            added.len(),
            args.out.display()
        );
    } else {
        outln!(
            "signed {} new node certificate(s) in {} with its CA ({} already there, left as they were)",
            added.len(),
            args.out.display(),
            have.len()
        );
    }
    if let (Some(target), Some(manifest)) = (secret, manifest) {
        let path = args.out.join(target.file_name());
        write_secret_file(&path, &manifest)?;
        outln!(
            "wrote the Kubernetes Secret {} to {} again, with every node's pair",
            target.name,
            path.display()
        );
    }
    Ok(())
}

/// The Kubernetes Secret `--k8s-secret` writes: its name and namespace, checked.
#[derive(Debug)]
struct SecretTarget {
    name: String,
    namespace: Option<String>,
}

impl SecretTarget {
    fn new(name: &str, namespace: Option<&str>) -> Result<Self, CliError> {
        check_dns_name("--k8s-secret", name, DNS_SUBDOMAIN_BYTES_MAX, true)?;
        if let Some(namespace) = namespace {
            check_dns_name("--namespace", namespace, DNS_LABEL_BYTES_MAX, false)?;
        }
        Ok(Self {
            name: name.to_string(),
            namespace: namespace.map(str::to_string),
        })
    }

    fn file_name(&self) -> String {
        format!("{}.secret.yaml", self.name)
    }

    /// The Secret manifest (YAML, `data:` base64): `ca.pem`, then each node's `.pem` and
    /// `.key` under the file names a process looks for, so that the mounted Secret is a certs
    /// directory. Never the CA key.
    fn manifest(&self, ca_cert_pem: &str, nodes: &[NodeCredentials]) -> Result<String, CliError> {
        let mut files = vec![(CA_FILE.to_string(), ca_cert_pem)];
        for node in nodes {
            let stem = node.node.file_stem();
            files.push((format!("{stem}.pem"), node.cert_pem.as_str()));
            files.push((format!("{stem}.key"), node.key_pem.as_str()));
        }
        let bytes: usize = files.iter().map(|(_, text)| text.len()).sum();
        if bytes > SECRET_BYTES_MAX {
            return Err(CliError::Usage(format!(
                "--k8s-secret {}: the CA and {} node certificate(s) and key(s) take {bytes} \
                 bytes, more than the {SECRET_BYTES_MAX} bytes a Kubernetes Secret may hold; \
                 make one Secret per task type (run `cohort certs` with a --cluster of that \
                 type only)",
                self.name,
                nodes.len()
            )));
        }
        let mut yaml = String::from(
            "# Made by `cohort certs`: the cluster CA certificate and every node's certificate \
             and key\n# (not the CA key). Mount it as the certs directory (COHORT_CERTS) of \
             every pod of the job;\n# each process loads <type>-<index>.pem/.key by its own \
             task.\napiVersion: v1\nkind: Secret\nmetadata:\n",
        );
        yaml.push_str(&format!("  name: {}\n", self.name));
        if let Some(namespace) = &self.namespace {
            yaml.push_str(&format!("  namespace: {namespace}\n"));
        }
        yaml.push_str(
            "  labels:\n    app.kubernetes.io/name: cohort\n    \
             app.kubernetes.io/component: certs\ntype: Opaque\ndata:\n",
        );
        let base64 = base64::engine::general_purpose::STANDARD;
        for (key, text) in files {
            yaml.push_str(&format!("  {key}: {}\n", base64.encode(text)));
        }
        Ok(yaml)
    }
}

/// Refuses `value` for `flag` unless it is a Kubernetes object name: an RFC 1123 label
/// (lowercase letters, digits, `-`, starting and ending with a letter or digit), or with
/// `dots` a subdomain of such labels, of at most `bytes_max` bytes.
fn check_dns_name(flag: &str, value: &str, bytes_max: usize, dots: bool) -> Result<(), CliError> {
    let label_ok = |label: &str| {
        let bytes = label.as_bytes();
        !bytes.is_empty()
            && bytes[0].is_ascii_alphanumeric()
            && bytes[bytes.len() - 1].is_ascii_alphanumeric()
            && bytes
                .iter()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
    };
    let ok = value.len() <= bytes_max
        && if dots {
            value.split('.').all(label_ok)
        } else {
            label_ok(value)
        };
    if ok {
        return Ok(());
    }
    let form = if dots {
        "lowercase letters, digits, '-' and '.'"
    } else {
        "lowercase letters, digits and '-'"
    };
    Err(CliError::Usage(format!(
        "{flag}: {value:?} is not a Kubernetes name: expected 1 to {bytes_max} {form}, \
         starting and ending with a letter or digit"
    )))
}

/// Longest Kubernetes object name (a DNS subdomain, RFC 1123).
const DNS_SUBDOMAIN_BYTES_MAX: usize = 253;
/// Longest namespace name (a DNS label, RFC 1123).
const DNS_LABEL_BYTES_MAX: usize = 63;
/// Most data one Kubernetes Secret may hold (1 MiB).
const SECRET_BYTES_MAX: usize = 1024 * 1024;

fn nodes_of(cluster: &str) -> Result<Vec<NodeId>, CliError> {
    let path = Path::new(cluster);
    if path.is_file() {
        let text = crate::cluster::read_config_file(path)
            .map_err(|e| CliError::Usage(format!("--cluster {}: {e}", path.display())))?;
        let spec = if text.trim_start().starts_with('{') {
            ClusterConfig::from_tf_config(&text).map(|c| c.cluster)
        } else {
            ClusterSpec::from_toml(&path.display().to_string(), &text)
        }
        .map_err(|e| CliError::Usage(format!("--cluster {}: {e}", path.display())))?;
        return Ok(spec
            .tasks()
            .map(|t| NodeId::new(t.task_type.as_str(), t.index))
            .collect());
    }
    let mut nodes = Vec::new();
    for part in cluster.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (job, count) = part.split_once('=').ok_or_else(|| {
            CliError::Usage(format!(
                "--cluster: {part:?} is neither a file nor JOB=COUNT (e.g. chief=1,ps=2,worker=2)"
            ))
        })?;
        let task_type =
            TaskType::parse("--cluster", job.trim()).map_err(|e| CliError::Usage(e.to_string()))?;
        let count: u32 = count.trim().parse().map_err(|_| {
            CliError::Usage(format!("--cluster: {part:?}: count must be a whole number"))
        })?;
        if count > 10_000 {
            return Err(CliError::Usage(format!(
                "--cluster: {part:?}: at most 10000 tasks per job"
            )));
        }
        nodes.extend((0..count).map(|i| NodeId::new(task_type.as_str(), i)));
    }
    if nodes.is_empty() {
        return Err(CliError::Usage("--cluster: names no node".into()));
    }
    Ok(nodes)
}

/// Writes `text` to `path`, readable by its owner only: a private key or a manifest holding
/// private keys.
fn write_secret_file(path: &Path, text: &str) -> Result<(), CliError> {
    use std::io::Write;
    #[cfg(unix)]
    use std::os::unix::fs::OpenOptionsExt;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    options.mode(0o600);
    let mut file = options
        .open(path)
        .map_err(|e| CliError::Failed(format!("{}: {e}", path.display())))?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|e| CliError::Failed(format!("{}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(out: &Path, cluster: &str, secret: Option<&str>, namespace: Option<&str>) -> CertsArgs {
        CertsArgs {
            out: out.to_path_buf(),
            cluster: cluster.into(),
            name: "test".into(),
            force: false,
            add: false,
            renew: false,
            k8s_secret: secret.map(str::to_string),
            namespace: namespace.map(str::to_string),
            valid_days: 365,
            ca_valid_days: 3650,
        }
    }

    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("cohort-certs-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    /// The `data:` entries of a manifest made by [`SecretTarget::manifest`], decoded.
    fn secret_data(manifest: &str) -> Vec<(String, String)> {
        let data = manifest.split_once("\ndata:\n").expect("a data: section").1;
        data.lines()
            .map(|line| {
                let (key, value) = line.trim().split_once(": ").expect("key: value");
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(value)
                    .expect("base64");
                (key.to_string(), String::from_utf8(bytes).expect("text"))
            })
            .collect()
    }

    /// `--add` signs only the missing nodes with the CA already in --out, leaves every file
    /// there as it was, and says what is wrong without a CA to sign with.
    #[test]
    fn add_signs_the_missing_nodes_with_the_ca_in_place_and_replaces_nothing() {
        let dir = scratch("add");
        run(args(&dir, "chief=1,ps=1,worker=2", None, None)).unwrap();
        let before: Vec<(String, Vec<u8>)> = ["ca.pem", "ca.key", "worker-1.pem", "worker-1.key"]
            .iter()
            .map(|f| (f.to_string(), std::fs::read(dir.join(f)).unwrap()))
            .collect();
        let mut more = args(&dir, "chief=1,ps=1,worker=4", Some("job-certs"), None);
        more.add = true;
        run(more).unwrap();
        for (file, bytes) in &before {
            assert_eq!(
                &std::fs::read(dir.join(file)).unwrap(),
                bytes,
                "{file} changed"
            );
        }
        // A new worker's certificate and an old node's trust each other: one CA signed both
        // (mutual TLS over real QUIC on 127.0.0.1).
        let chief = NodeCredentials::load(&dir, &NodeId::new("chief", 0)).unwrap();
        let joiner = NodeCredentials::load(&dir, &NodeId::new("worker", 3)).unwrap();
        assert!(NodeCredentials::load(&dir, &NodeId::new("worker", 2)).is_ok());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            use cohort_transport::{Endpoint, TransportConfig};
            let local = "127.0.0.1:0".parse().unwrap();
            let server = Endpoint::bind(local, chief, TransportConfig::for_tests()).unwrap();
            let client = Endpoint::bind(local, joiner, TransportConfig::for_tests()).unwrap();
            let chief_id = NodeId::new("chief", 0);
            let at = server.local_addr().unwrap();
            let accepting = async { server.accept().await.map(|c| c.is_ok()) };
            let (dialed, accepted) = tokio::join!(client.connect(at, &chief_id), accepting);
            assert!(dialed.is_ok(), "{:?}", dialed.err());
            assert_eq!(accepted, Some(true));
        });
        let manifest = std::fs::read_to_string(dir.join("job-certs.secret.yaml")).unwrap();
        let keys: Vec<String> = secret_data(&manifest).into_iter().map(|(k, _)| k).collect();
        assert!(keys.contains(&"worker-3.pem".to_string()), "{keys:?}");
        assert!(keys.contains(&"chief-0.key".to_string()), "{keys:?}");
        let none = scratch("add-no-ca");
        let mut without = args(&none, "worker=1", None, None);
        without.add = true;
        let err = run(without).unwrap_err().to_string();
        assert!(err.contains("--add") && err.contains("ca.pem"), "{err}");
        assert!(!none.join("worker-0.pem").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// `--renew` replaces every node's pair with a new one signed by the CA in place (which
    /// stays), so that a process reloading its files is still trusted by the others.
    #[test]
    fn renew_replaces_every_nodes_pair_and_keeps_the_ca() {
        let dir = scratch("renew");
        run(args(&dir, "chief=1,worker=2", None, None)).unwrap();
        let read = |f: &str| std::fs::read(dir.join(f)).unwrap();
        let (ca, ca_key, cert, key) = (
            read("ca.pem"),
            read("ca.key"),
            read("worker-1.pem"),
            read("worker-1.key"),
        );
        let mut renew = args(&dir, "chief=1,worker=2", None, None);
        renew.renew = true;
        run(renew).unwrap();
        assert_eq!(read("ca.pem"), ca);
        assert_eq!(read("ca.key"), ca_key);
        assert_ne!(read("worker-1.pem"), cert);
        assert_ne!(read("worker-1.key"), key);
        let renewed = NodeCredentials::load(&dir, &NodeId::new("worker", 1)).unwrap();
        assert_eq!(renewed.ca_cert_pem.as_bytes(), ca.as_slice());
        let none = scratch("renew-no-ca");
        let mut without = args(&none, "worker=1", None, None);
        without.renew = true;
        let err = run(without).unwrap_err().to_string();
        assert!(err.contains("--renew") && err.contains("ca.pem"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_secret_holds_every_nodes_pair_under_its_file_name_and_never_the_ca_key() {
        let dir = scratch("secret");
        run(args(
            &dir,
            "chief=1,ps=1,worker=2",
            Some("job-certs"),
            Some("ml"),
        ))
        .unwrap();
        let manifest = std::fs::read_to_string(dir.join("job-certs.secret.yaml")).unwrap();
        assert!(manifest.contains("kind: Secret\n"), "{manifest}");
        assert!(
            manifest.contains("  name: job-certs\n  namespace: ml\n"),
            "{manifest}"
        );
        let data = secret_data(&manifest);
        let keys: Vec<&str> = data.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            [
                "ca.pem",
                "chief-0.pem",
                "chief-0.key",
                "ps-0.pem",
                "ps-0.key",
                "worker-0.pem",
                "worker-0.key",
                "worker-1.pem",
                "worker-1.key"
            ]
        );
        // Each entry is the file `cohort certs` wrote beside it; the CA key is in none.
        let ca_key = std::fs::read_to_string(dir.join("ca.key")).unwrap();
        for (key, text) in &data {
            assert_eq!(
                &std::fs::read_to_string(dir.join(key)).unwrap(),
                text,
                "{key}"
            );
            assert_ne!(text, &ca_key);
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.join("job-certs.secret.yaml"))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o077, 0, "the manifest holds private keys: {mode:o}");
        }
        // A second run does not replace it unless told to.
        let err = run(args(&dir, "chief=1,ps=1,worker=2", Some("job-certs"), None)).unwrap_err();
        assert!(err.to_string().contains("job-certs.secret.yaml"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn without_a_namespace_the_secret_names_none() {
        let target = SecretTarget::new("certs", None).unwrap();
        let ca = ClusterCa::generate("test").unwrap();
        let node = ca.issue(&NodeId::new("worker", 0)).unwrap();
        let manifest = target.manifest(ca.cert_pem(), &[node]).unwrap();
        assert!(!manifest.contains("namespace:"), "{manifest}");
        assert_eq!(secret_data(&manifest).len(), 3);
    }

    #[test]
    fn bad_secret_or_namespace_names_are_refused_naming_the_flag_and_nothing_is_written() {
        for (name, namespace, flag) in [
            ("Certs", None, "--k8s-secret"),
            ("certs_1", None, "--k8s-secret"),
            ("-certs", None, "--k8s-secret"),
            ("certs.", None, "--k8s-secret"),
            ("", None, "--k8s-secret"),
            ("certs", Some("my.ns"), "--namespace"),
            ("certs", Some("ns-"), "--namespace"),
        ] {
            let dir = scratch("badname");
            let err = run(args(&dir, "chief=1,ps=1,worker=1", Some(name), namespace)).unwrap_err();
            assert_eq!(err.exit_code(), 2, "{err}");
            assert!(
                err.to_string().starts_with(flag),
                "{name:?} {namespace:?}: {err}"
            );
            assert!(!dir.exists(), "nothing is written for a refused name");
        }
        let long = "a".repeat(64);
        assert!(SecretTarget::new("certs", Some(&long)).is_err());
        assert!(SecretTarget::new("certs.example-1", Some(&long[..63])).is_ok());
    }

    #[test]
    fn a_cluster_too_large_for_one_secret_is_refused_before_anything_is_written() {
        let dir = scratch("huge");
        let err = run(args(&dir, "chief=1,ps=1,worker=2000", Some("certs"), None)).unwrap_err();
        assert_eq!(err.exit_code(), 2, "{err}");
        let message = err.to_string();
        assert!(
            message.starts_with("--k8s-secret certs:") && message.contains("1048576 bytes"),
            "{message}"
        );
        assert!(!dir.exists(), "--out is left as it was");
    }
}
