//! A libvirt domain's QEMU (`--libvirt DOMAIN`): libvirtd holds QEMU's QMP monitor, so
//! glass reaches it through `virsh qemu-monitor-command` (HMP commands passed through
//! as libvirt documents it), reads QEMU's pid from libvirt's pid file, and asks libvirt
//! how a domain ended (`virsh domstate --reason`). The domain's XML is not touched.
//! virsh rather than libvirt's C library: glass then builds and runs where libvirt is
//! absent, and these few calls happen outside the sample path.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::qmp::{io_text, Monitor, MonitorError};

pub struct Libvirt {
    domain: String,
    uri: String,
    pid: i32,
}

impl Libvirt {
    /// The running or paused domain `domain` (name, id or UUID as virsh takes them).
    pub fn open(domain: &str) -> Result<Libvirt, MonitorError> {
        let bad = |what: String| MonitorError::BadInput(format!("--libvirt {domain}: {what}"));
        let uri = std::env::var("LIBVIRT_DEFAULT_URI").unwrap_or_else(|_| "qemu:///system".into());
        let mut libvirt = Libvirt {
            domain: domain.to_string(),
            uri,
            pid: 0,
        };
        let state = libvirt.virsh(&["domstate", domain]).map_err(|e| match e {
            VirshError::Missing => bad("virsh not found (install libvirt-clients)".into()),
            VirshError::Said(text)
                if text.contains("ailed to get domain")
                    || text.contains("no domain with matching") =>
            {
                let names = libvirt
                    .virsh(&["list", "--name"])
                    .map(|t| t.split_whitespace().collect::<Vec<_>>().join(", "))
                    .unwrap_or_default();
                let running = if names.is_empty() {
                    "none".to_string()
                } else {
                    names
                };
                bad(format!("no such domain (running: {running})"))
            }
            VirshError::Said(text) => bad(text),
        })?;
        // Paused is for the caller to judge (glass refuses it; its guardian resumes a
        // domain glass's stub left paused); a domain without a QEMU has no monitor.
        if !matches!(state.trim(), "running" | "paused") {
            return Err(bad(format!(
                "the domain is {} (glass samples a running domain; start or resume it first)",
                state.trim()
            )));
        }
        // libvirt's pid file for the domain's QEMU, readable by root only.
        let name = libvirt
            .virsh(&["domname", domain])
            .map(|n| n.trim().to_string())
            .unwrap_or_else(|_| domain.to_string());
        let pid_file = format!("/run/libvirt/qemu/{name}.pid");
        let pid = std::fs::read_to_string(&pid_file)
            .map_err(|e| bad(format!("cannot read {pid_file}: {}", io_text(&e))))?;
        libvirt.pid = pid
            .trim()
            .parse()
            .map_err(|_| bad(format!("{pid_file} holds no pid")))?;
        Ok(libvirt)
    }

    fn virsh(&self, args: &[&str]) -> Result<String, VirshError> {
        let output = Command::new("virsh")
            .arg("-q")
            .arg("-c")
            .arg(&self.uri)
            .args(args)
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => VirshError::Missing,
                _ => VirshError::Said(e.to_string()),
            })?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            let text = String::from_utf8_lossy(&output.stderr);
            let text = text
                .lines()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("virsh failed");
            Err(VirshError::Said(
                text.trim().trim_start_matches("error: ").to_string(),
            ))
        }
    }
}

enum VirshError {
    Missing,
    Said(String),
}

impl Monitor for Libvirt {
    fn hmp(&mut self, command: &str) -> Result<String, MonitorError> {
        self.virsh(&["qemu-monitor-command", &self.domain, "--hmp", command])
            .map_err(|e| match e {
                VirshError::Missing => MonitorError::Failed("virsh not found".into()),
                VirshError::Said(text) => MonitorError::Failed(format!(
                    "libvirt domain {}: {command}: {text}",
                    self.domain
                )),
            })
    }

    fn qmp(
        &mut self,
        command: &str,
        arguments: Option<serde_json::Value>,
    ) -> Result<serde_json::Value, MonitorError> {
        let mut message = serde_json::json!({ "execute": command });
        if let Some(arguments) = arguments {
            message["arguments"] = arguments;
        }
        let reply = self
            .virsh(&["qemu-monitor-command", &self.domain, &message.to_string()])
            .map_err(|e| match e {
                VirshError::Missing => MonitorError::Failed("virsh not found".into()),
                VirshError::Said(text) => MonitorError::Failed(format!(
                    "libvirt domain {}: QMP {command}: {text}",
                    self.domain
                )),
            })?;
        let value: serde_json::Value = serde_json::from_str(reply.trim())
            .map_err(|e| MonitorError::Failed(format!("QMP {command}: {e}")))?;
        match (value.get("return"), value.pointer("/error/desc")) {
            (Some(answer), _) => Ok(answer.clone()),
            (None, Some(desc)) => Err(MonitorError::Failed(format!(
                "QMP {command}: {}",
                desc.as_str().unwrap_or("refused")
            ))),
            (None, None) => Err(MonitorError::Failed(format!(
                "QMP {command}: no answer in {}",
                reply.trim()
            ))),
        }
    }

    fn status(&mut self) -> Result<String, MonitorError> {
        let status = self.qmp("query-status", None)?;
        Ok(status
            .get("status")
            .and_then(serde_json::Value::as_str)
            .unwrap_or("unknown")
            .to_string())
    }

    fn qemu_pid(&self) -> i32 {
        self.pid
    }

    fn ending(&mut self) -> Option<String> {
        // Until libvirt has seen QEMU go (or 10 s), QEMU's own exit first: its monitor
        // stops answering once its main loop ended.
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let gone = !std::path::Path::new(&format!("/proc/{}", self.pid)).exists();
            if !gone && self.status().is_ok() {
                return None;
            }
            let state = self
                .virsh(&["domstate", &self.domain, "--reason"])
                .unwrap_or_default();
            let state = state.trim();
            if !state.is_empty() && !state.starts_with("running") {
                return Some(if state.contains("(shutdown)") {
                    format!("guest powered off (libvirt: domain {state})")
                } else {
                    format!("VM ended (libvirt: domain {state})")
                });
            }
            if Instant::now() > until {
                return Some(format!(
                    "QEMU's monitor stopped answering (libvirt: domain {})",
                    if state.is_empty() {
                        "state unknown"
                    } else {
                        state
                    }
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn describe(&self) -> String {
        format!("libvirt domain {}", self.domain)
    }
}
