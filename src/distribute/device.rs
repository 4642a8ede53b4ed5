//! Device names for replicas and variables (`cpu:0`, `/device:CPU:1`, ...).

use std::fmt;
use std::str::FromStr;

/// The kind of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceKind {
    /// A host CPU; replicas `cpu:0..N` are threads of this process.
    Cpu,
    /// A GPU; parsed so that names are accepted, but no local strategy places replicas on GPUs
    /// yet (they come with the NCCL issue).
    Gpu,
}

/// A device a replica runs on or a variable lives on, as TensorFlow names them.
///
/// Parses `cpu:0`, `CPU:0`, `/cpu:0`, `/device:CPU:0` and
/// `/job:localhost/replica:0/task:0/device:CPU:0` (the job/task prefix is ignored here).
///
/// ```
/// use cohort::strategy::DeviceSpec;
/// let d: DeviceSpec = "/device:CPU:1".parse().unwrap();
/// assert_eq!(d, DeviceSpec::cpu(1));
/// assert_eq!(d.to_string(), "cpu:1");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeviceSpec {
    /// CPU or GPU.
    pub kind: DeviceKind,
    /// The device's index among devices of its kind.
    pub index: usize,
}

impl DeviceSpec {
    /// The `index`-th CPU device.
    pub fn cpu(index: usize) -> Self {
        Self {
            kind: DeviceKind::Cpu,
            index,
        }
    }

    /// The candle device tensors placed here live on.
    pub fn to_candle(&self) -> Result<candle_core::Device, DeviceError> {
        match self.kind {
            // Every CPU replica shares the host's memory; candle has one CPU device.
            DeviceKind::Cpu => Ok(candle_core::Device::Cpu),
            DeviceKind::Gpu => Err(DeviceError::Unsupported {
                device: self.to_string(),
            }),
        }
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            DeviceKind::Cpu => write!(f, "cpu:{}", self.index),
            DeviceKind::Gpu => write!(f, "gpu:{}", self.index),
        }
    }
}

/// A device name that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    /// The name is not of the form `[/job:..][/device:]KIND:INDEX`.
    #[error("invalid device name {name:?}: expected e.g. \"cpu:0\" or \"/device:CPU:0\"")]
    Invalid {
        /// The name given.
        name: String,
    },
    /// The device exists as a name but local strategies cannot place replicas on it yet.
    #[error("device {device} is not supported by the local strategies yet (GPU replicas come with NCCL support)")]
    Unsupported {
        /// The device.
        device: String,
    },
}

impl FromStr for DeviceSpec {
    type Err = DeviceError;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        let invalid = || DeviceError::Invalid {
            name: name.to_string(),
        };
        // Keep only the device part of a fully qualified name.
        let tail = match name.rfind("device:") {
            Some(at) => &name[at + "device:".len()..],
            None => name.rsplit('/').next().unwrap_or(name),
        };
        let (kind, index) = tail.split_once(':').ok_or_else(invalid)?;
        let kind = match kind.to_ascii_lowercase().as_str() {
            "cpu" => DeviceKind::Cpu,
            "gpu" => DeviceKind::Gpu,
            _ => return Err(invalid()),
        };
        let index = index.parse::<usize>().map_err(|_| invalid())?;
        Ok(Self { kind, index })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_tensorflow_names() {
        for name in [
            "cpu:0",
            "CPU:0",
            "/cpu:0",
            "/device:CPU:0",
            "/job:localhost/replica:0/task:0/device:CPU:0",
        ] {
            assert_eq!(
                name.parse::<DeviceSpec>().unwrap(),
                DeviceSpec::cpu(0),
                "{name}"
            );
        }
        assert_eq!(
            "/gpu:3".parse::<DeviceSpec>().unwrap().kind,
            DeviceKind::Gpu
        );
        for bad in ["", "cpu", "tpu:0", "cpu:x", "cpu:-1"] {
            assert!(bad.parse::<DeviceSpec>().is_err(), "{bad}");
        }
    }
}
