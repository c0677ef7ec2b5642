//! Hostile images for `images_hostile.rs`: crafted headers (zero-size, 50k x 50k, a GIF canvas
//! bomb), truncations of the committed fixtures, formats that are not accepted, and a small
//! HTTP server on 127.0.0.1 (an allowed host) that redirects elsewhere, stalls, lies about
//! lengths and serves non-images.

use std::sync::OnceLock;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::images::fixture;

fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

fn png_chunk(kind: &[u8; 4], data: &[u8]) -> Vec<u8> {
    let mut out = (data.len() as u32).to_be_bytes().to_vec();
    let mut body = kind.to_vec();
    body.extend_from_slice(data);
    out.extend_from_slice(&body);
    out.extend_from_slice(&crc32(&body).to_be_bytes());
    out
}

/// A PNG of `width x height` (RGB8) whose only IDAT is `idat` (valid CRCs throughout).
pub fn png_header(width: u32, height: u32, idat: &[u8]) -> Vec<u8> {
    let mut ihdr = width.to_be_bytes().to_vec();
    ihdr.extend_from_slice(&height.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    out.extend(png_chunk(b"IHDR", &ihdr));
    out.extend(png_chunk(b"IDAT", idat));
    out.extend(png_chunk(b"IEND", &[]));
    out
}

/// A GIF whose logical screen and one frame are `w x h` (tiny LZW data).
pub fn gif(w: u16, h: u16, frames: usize) -> Vec<u8> {
    let mut out = b"GIF89a".to_vec();
    out.extend_from_slice(&w.to_le_bytes());
    out.extend_from_slice(&h.to_le_bytes());
    out.extend_from_slice(&[0x80, 0, 0, 0, 0, 0, 255, 255, 255]);
    for _ in 0..frames {
        out.extend_from_slice(&[0x2C, 0, 0, 0, 0]);
        out.extend_from_slice(&w.to_le_bytes());
        out.extend_from_slice(&h.to_le_bytes());
        out.extend_from_slice(&[0, 2, 2, 0x44, 0x01, 0]);
    }
    out.push(0x3B);
    out
}

/// The fixture JPEG with its frame header claiming `width x height`.
pub fn jpeg_claiming(width: u16, height: u16) -> Vec<u8> {
    let mut jpeg = fixture("photo.jpg");
    let sof = jpeg.windows(2).position(|w| w == [0xFF, 0xC0]).expect("SOF0");
    jpeg[sof + 5..sof + 7].copy_from_slice(&height.to_be_bytes());
    jpeg[sof + 7..sof + 9].copy_from_slice(&width.to_be_bytes());
    jpeg
}

pub fn cut(bytes: &[u8], fraction: f64) -> Vec<u8> {
    bytes[..(bytes.len() as f64 * fraction) as usize].to_vec()
}

/// The HTTP server's port: it runs on its own thread for the test process's lifetime.
pub fn http_port() -> u16 {
    static PORT: OnceLock<u16> = OnceLock::new();
    *PORT.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
                let port = listener.local_addr().expect("addr").port();
                tx.send(port).expect("port");
                loop {
                    let Ok((conn, _)) = listener.accept().await else { return };
                    tokio::spawn(answer(conn, port));
                }
            });
        });
        rx.recv_timeout(Duration::from_secs(10)).expect("media HTTP server start")
    })
}

async fn answer(mut conn: tokio::net::TcpStream, port: u16) {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match conn.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let path = String::from_utf8_lossy(&head).split_whitespace().nth(1).unwrap_or("/").to_owned();
    let ok = |mime: &str, body: &[u8]| {
        let mut out =
            format!("HTTP/1.1 200 OK\r\nContent-Type: {mime}\r\nContent-Length: {}\r\n\r\n", body.len())
                .into_bytes();
        out.extend_from_slice(body);
        out
    };
    let redirect = |to: String| {
        format!("HTTP/1.1 302 Found\r\nLocation: {to}\r\nContent-Length: 0\r\n\r\n").into_bytes()
    };
    let reply = match path.as_str() {
        "/ok.png" => ok("image/png", &fixture("landscape.png")),
        "/to-ok" => redirect("/ok.png".into()),
        "/to-localhost" => redirect(format!("http://localhost:{port}/ok.png")),
        "/to-elsewhere" => redirect("http://203.0.113.7/ok.png".into()),
        "/to-file" => redirect("file:///etc/passwd".into()),
        "/loop" => redirect("/loop".into()),
        "/svg" => ok("image/png", b"<svg xmlns='http://www.w3.org/2000/svg'/>"),
        "/html" => ok("text/html", b"<html><body>not an image</body></html>"),
        "/truncated.png" => ok("image/png", &cut(&fixture("landscape.png"), 0.5)),
        "/huge-header.png" => ok("image/png", &png_header(50_000, 50_000, &[])),
        "/declared-huge" => b"HTTP/1.1 200 OK\r\nContent-Length: 999999999\r\n\r\n".to_vec(),
        "/stall" => {
            tokio::time::sleep(Duration::from_secs(30)).await;
            ok("image/png", &fixture("landscape.png"))
        }
        "/empty" => ok("image/png", b""),
        _ => b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n".to_vec(),
    };
    let _ = conn.write_all(&reply).await;
    let _ = conn.shutdown().await;
}
