//! Interoperability: the ringrpc client calls a jsonrpsee 0.26 HTTP server, and
//! jsonrpsee's HTTP client calls the ringrpc server.

use jsonrpsee::server::{RpcModule, Server as JsonrpseeServer};
use jsonrpsee::types::{ErrorObject, ErrorObjectOwned, Params};
use jsonrpsee_core::client::ClientT;
use jsonrpsee_core::params::BatchRequestBuilder;
use jsonrpsee_core::rpc_params;
use jsonrpsee_http_client::HttpClientBuilder;
use ringrpc::client::{Client, Error};
use ringrpc::server::Server;
use ringrpc::{demo, Config};
use serde_json::{json, Value};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn ringrpc_client_calls_a_jsonrpsee_http_server() {
    let rt = runtime();
    let (addr, handle) = rt.block_on(async {
        let mut m = RpcModule::new(());
        m.register_method("add", |p: Params<'_>, _, _| {
            let [a, b]: [i64; 2] = p.parse()?;
            Ok::<_, ErrorObjectOwned>(a + b)
        })
        .unwrap();
        m.register_method("get_data", |_, _, _| {
            Ok::<_, ErrorObjectOwned>(("hello", 5))
        })
        .unwrap();
        m.register_method("fail", |_, _, _| {
            Err::<(), _>(ErrorObject::owned(7, "nope", Some(json!({"why": [1, 2]}))))
        })
        .unwrap();
        m.register_method("update", |_, _, _| Ok::<_, ErrorObjectOwned>(()))
            .unwrap();
        let server = JsonrpseeServer::builder()
            .build("127.0.0.1:0")
            .await
            .unwrap();
        let addr = server.local_addr().unwrap();
        (addr, server.start(m))
    });
    let c = Client::connect(&format!("http://{addr}/")).unwrap();
    for i in 0..100 {
        assert_eq!(c.call::<i64, _>("add", [i, 1]).unwrap(), i + 1);
    }
    assert_eq!(
        c.call::<(String, i64), _>("get_data", ()).unwrap(),
        ("hello".to_owned(), 5)
    );
    match c.call::<Value, _>("fail", ()).unwrap_err() {
        Error::Server(e) => {
            assert_eq!((e.code, e.message.as_str()), (7, "nope"));
            let data: Value = serde_json::from_str(e.data.as_deref().unwrap()).unwrap();
            assert_eq!(data, json!({"why": [1, 2]}));
        }
        other => panic!("{other:?}"),
    }
    match c.call::<Value, _>("missing", ()).unwrap_err() {
        Error::Server(e) => assert_eq!(e.code, -32601),
        other => panic!("{other:?}"),
    }
    c.notify("update", [1]).unwrap();
    let mut b = c.batch();
    let x = b.call("add", [40, 2]).unwrap();
    b.notify("update", [1]).unwrap();
    let y = b.call("missing", ()).unwrap();
    let mut r = b.send().unwrap();
    assert_eq!(r.get::<i64>(x).unwrap(), 42);
    assert!(matches!(r.get::<Value>(y), Err(Error::Server(e)) if e.code == -32601));
    // Pipelined calls from several threads on the one keep-alive connection.
    std::thread::scope(|s| {
        for t in 0..4 {
            let c = &c;
            s.spawn(move || {
                for i in 0..50 {
                    assert_eq!(c.call::<i64, _>("add", [t, i]).unwrap(), t + i);
                }
            });
        }
    });
    handle.stop().unwrap();
}

#[test]
fn jsonrpsee_http_client_calls_the_ringrpc_server() {
    let mut server = Server::new(demo::engine(Config::default())).unwrap();
    let addr = server.listen_http("127.0.0.1:0").unwrap();
    let stop = server.handle();
    let thread = std::thread::spawn(move || server.run());
    let rt = runtime();
    rt.block_on(async {
        let client = HttpClientBuilder::default()
            .build(format!("http://{addr}"))
            .unwrap();
        let r: i64 = client
            .request("subtract", rpc_params![42, 23])
            .await
            .unwrap();
        assert_eq!(r, 19);
        let r: (String, i64) = client.request("get_data", rpc_params![]).await.unwrap();
        assert_eq!(r, ("hello".to_owned(), 5));
        let r: Value = client
            .request("echo", rpc_params![json!({"a": [1, 2]})])
            .await
            .unwrap();
        assert_eq!(r, json!([{"a": [1, 2]}]));
        match client.request::<Value, _>("foobar", rpc_params![]).await {
            Err(jsonrpsee_core::ClientError::Call(e)) => assert_eq!(e.code(), -32601),
            other => panic!("{other:?}"),
        }
        client
            .notification("update", rpc_params![1, 2])
            .await
            .unwrap();
        let mut batch = BatchRequestBuilder::new();
        batch.insert("add", rpc_params![1, 2]).unwrap();
        batch.insert("add", rpc_params![3, 4]).unwrap();
        batch.insert("sum", rpc_params![5, 6, 7]).unwrap();
        let res = client.batch_request::<i64>(batch).await.unwrap();
        let got: Vec<i64> = res.into_ok().unwrap().collect();
        assert_eq!(got, vec![3, 7, 18]);
    });
    stop.shutdown();
    thread.join().unwrap().unwrap();
}

/// Params given as raw JSON text (as the example CLI does) may be pretty-printed: their
/// newlines must not split the request line on a newline-delimited transport.
#[test]
fn raw_params_with_newlines_stay_one_request_line() {
    let mut server = Server::new(demo::engine(Config::default())).unwrap();
    let tcp = server.listen_tcp("127.0.0.1:0").unwrap();
    let http = server.listen_http("127.0.0.1:0").unwrap();
    let stop = server.handle();
    let thread = std::thread::spawn(move || server.run());
    let params = serde_json::value::RawValue::from_string("[\n  42,\r\n  23\n]".into()).unwrap();
    let named = serde_json::value::RawValue::from_string(
        "{\n\"subtrahend\": 23,\n\"minuend\": 42\n}".into(),
    )
    .unwrap();
    for url in [format!("tcp://{tcp}"), format!("http://{http}/")] {
        let c = Client::connect(&url).unwrap();
        assert_eq!(c.call::<i64, _>("subtract", &params).unwrap(), 19, "{url}");
        assert_eq!(c.call::<i64, _>("subtract", &named).unwrap(), 19, "{url}");
        let mut b = c.batch();
        let k = b.call("subtract", &params).unwrap();
        assert_eq!(b.send().unwrap().get::<i64>(k).unwrap(), 19, "{url}");
    }
    stop.shutdown();
    thread.join().unwrap().unwrap();
}
