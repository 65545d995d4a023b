//! A TCP proxy a test puts between a process and a server, to cut the
//! network between them and restore it.
//!
//! A cut behaves like a partition, not like a closed port: bytes already
//! sent wait in the proxy, new connections are accepted and left hanging,
//! nothing is refused or reset. On restore, everything held flows on, as
//! TCP's retransmissions would deliver it once a real partition heals. So
//! the process sees a peer that went silent and then came back, with its
//! in-flight requests answered late.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct TcpProxy {
    addr: SocketAddr,
    open: watch::Sender<bool>,
    _task: tokio::task::JoinHandle<()>,
}

impl TcpProxy {
    /// A proxy on a free loopback port forwarding to `upstream`.
    pub async fn start(upstream: SocketAddr) -> TcpProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (open, watch) = watch::channel(true);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let watch = watch.clone();
                tokio::spawn(async move {
                    wait_open(&mut watch.clone()).await;
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    tokio::spawn(pump(cr, sw, watch.clone()));
                    tokio::spawn(pump(sr, cw, watch));
                });
            }
        });
        TcpProxy {
            addr,
            open,
            _task: task,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops all traffic both ways, holding what is in flight.
    pub fn cut(&self) {
        self.open.send_replace(false);
    }

    /// Lets the held traffic and everything after it through again.
    pub fn restore(&self) {
        self.open.send_replace(true);
    }
}

async fn wait_open(watch: &mut watch::Receiver<bool>) {
    // An error means the proxy is gone: let the copy end on its own.
    let _ = watch.wait_for(|open| *open).await;
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut watch: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => {
                let _ = to.shutdown().await;
                return;
            }
            Ok(n) => n,
        };
        wait_open(&mut watch).await;
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
