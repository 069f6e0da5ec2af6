//! gRPC channels to other nodes, one per address, made on first use and
//! connected lazily (a node that is down costs nothing until it is called).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

use crate::{Error, Result};

/// How long connecting to a node may take before the call fails.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Default)]
pub struct Channels {
    channels: Mutex<HashMap<String, Channel>>,
}

impl Channels {
    /// The channel to `addr` (host:port).
    pub fn channel(&self, addr: &str) -> Result<Channel> {
        // The map holds plain data; a panic while it was held cannot leave
        // it inconsistent, so a poisoned lock is still usable.
        let mut map = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = map.get(addr) {
            return Ok(c.clone());
        }
        let channel = Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| Error::Invalid(format!("bad node address {addr}: {e}")))?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .connect_lazy();
        map.insert(addr.to_string(), channel.clone());
        Ok(channel)
    }
}
