//! The project's fault-injecting proxy in front of a server and a bucket of its own: a
//! tier configured through the proxy, so that a test sets what happens to each request.

use kvtier_core::Tier;
use serde_json::{json, Value};

use super::config::{tier_json, with, with_all};
use super::proxy::Proxy;
use super::servers::Server;

/// A proxy in front of a server the test does not own (a fresh s3s-fs, or a test binary's
/// shared moto or RGW), and a new bucket on it.
pub struct Front<'a> {
    pub srv: &'a Server,
    pub proxy: Proxy,
    pub bucket: String,
}

impl<'a> Front<'a> {
    pub fn new(srv: &'a Server) -> Front<'a> {
        let proxy = Proxy::start(srv.port());
        let bucket = srv.new_bucket();
        Front { srv, proxy, bucket }
    }

    /// The `store` section through the proxy, with `extra` keys set.
    pub fn store(&self, extra: Value) -> Value {
        let store = with(
            self.srv.store_json(&self.bucket),
            "endpoint_override",
            json!(self.proxy.endpoint()),
        );
        with_all(store, extra)
    }

    /// A tier talking to the server through the proxy: `store_extra` set in its `store`
    /// section, `top_extra` beside it.
    pub fn tier(&self, store_extra: Value, top_extra: Value) -> Tier {
        Tier::from_json(&tier_json(self.store(store_extra), top_extra))
            .unwrap_or_else(|e| panic!("{}: tier start: {e}", self.srv.name()))
    }

    /// Points the proxy at the server again, after the server was restarted on a new port.
    pub fn follow_restart(&self) {
        self.proxy.set_upstream(self.srv.port());
    }
}
