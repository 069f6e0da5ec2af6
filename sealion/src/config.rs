//! Settings from a TOML file, fed to clap through `SEALION_*` variables so
//! flags and the environment still take precedence.

use std::path::PathBuf;

use anyhow::{Context, bail};

/// Finds `--config FILE` (or `SEALION_CONFIG`) before clap runs and sets
/// `SEALION_<KEY>` for every key of the file that the environment does not
/// already set.
pub fn load_config_file_into_env() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let mut path: Option<PathBuf> = std::env::var_os("SEALION_CONFIG").map(PathBuf::from);
    for (i, a) in args.iter().enumerate() {
        if let Some(p) = a.strip_prefix("--config=") {
            path = Some(PathBuf::from(p));
        } else if a == "--config" {
            if let Some(p) = args.get(i + 1) {
                path = Some(PathBuf::from(p));
            }
        }
    }
    let Some(path) = path else { return Ok(()) };
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("reading config file {}", path.display()))?;
    let table: toml::Table = text
        .parse()
        .with_context(|| format!("parsing config file {}", path.display()))?;
    for (key, value) in table {
        let var = format!("SEALION_{}", key.replace('-', "_").to_ascii_uppercase());
        let text = match value {
            toml::Value::String(s) => s,
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::Boolean(b) => b.to_string(),
            toml::Value::Float(f) => f.to_string(),
            toml::Value::Array(items) => items
                .iter()
                .map(|v| {
                    v.as_str()
                        .map(str::to_string)
                        .unwrap_or_else(|| v.to_string())
                })
                .collect::<Vec<_>>()
                .join(","),
            other => bail!("config key {key}: unsupported value {other}"),
        };
        if std::env::var_os(&var).is_none() {
            set_env(&var, &text);
        }
    }
    Ok(())
}

#[allow(unsafe_code)]
fn set_env(key: &str, value: &str) {
    // SAFETY: called from main before the runtime or any other thread starts,
    // so nothing reads the environment concurrently.
    unsafe { std::env::set_var(key, value) }
}
