//! One transfer on a byte stream: the decode instance sends a request frame naming the key
//! and how long it will wait; the prefill instance answers with one response frame, then the
//! pages. A frame is the 4-byte magic `PGKV`, a big-endian `u32` length and that many bytes of
//! JSON; the pages follow the response as raw bytes, as many as its `pages_len` says. JSON keeps
//! the small header readable; the pages, nearly all of the bytes, are never encoded.

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use pagoda_engine::KvPageLayout;

pub const MAGIC: &[u8; 4] = b"PGKV";
pub const VERSION: u32 = 1;
/// Largest JSON header accepted (a 128k-token prompt's ids fit with room to spare).
pub const MAX_HEADER_BYTES: usize = 16 << 20;
/// Largest page payload accepted.
pub const MAX_PAGES_BYTES: u64 = 64 << 30;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FetchRequest {
    pub version: u32,
    pub key: String,
    /// The model the decode instance serves; a producer serving another refuses.
    pub model: String,
    /// How long the producer may wait for the key to be held before answering `not_found`.
    pub wait_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Ok,
    NotFound,
    Error,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WireLayout {
    pub dtype: String,
    pub element_bytes: usize,
    pub num_layers: usize,
    pub block_size: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    /// An FP8 cache's (K, V) scales per layer; absent for a float cache. JSON numbers carry an
    /// f32 exactly (serde writes the shortest form that reads back to the same bits).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scales: Vec<[f32; 2]>,
}

impl From<&KvPageLayout> for WireLayout {
    fn from(l: &KvPageLayout) -> Self {
        Self {
            dtype: l.dtype.clone(),
            element_bytes: l.element_bytes,
            num_layers: l.num_layers,
            block_size: l.block_size,
            num_kv_heads: l.num_kv_heads,
            head_dim: l.head_dim,
            scales: l.scales.iter().map(|s| s.map(f32::from_bits)).collect(),
        }
    }
}

impl From<WireLayout> for KvPageLayout {
    fn from(l: WireLayout) -> Self {
        Self {
            dtype: l.dtype,
            element_bytes: l.element_bytes,
            num_layers: l.num_layers,
            block_size: l.block_size,
            num_kv_heads: l.num_kv_heads,
            head_dim: l.head_dim,
            scales: l.scales.iter().map(|s| s.map(f32::to_bits)).collect(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FetchResponse {
    pub version: u32,
    pub status: Status,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layout: Option<WireLayout>,
    #[serde(default)]
    pub token_ids: Vec<u32>,
    #[serde(default)]
    pub pages_len: u64,
}

impl FetchResponse {
    pub fn failed(status: Status, message: impl Into<String>) -> Self {
        Self {
            version: VERSION,
            status,
            message: Some(message.into()),
            layout: None,
            token_ids: Vec::new(),
            pages_len: 0,
        }
    }
}

/// Writes one JSON frame.
pub async fn write_frame<W: AsyncWrite + Unpin, T: Serialize>(w: &mut W, value: &T) -> std::io::Result<()> {
    let json = serde_json::to_vec(value).map_err(std::io::Error::other)?;
    let len = u32::try_from(json.len()).map_err(std::io::Error::other)?;
    w.write_all(MAGIC).await?;
    w.write_all(&len.to_be_bytes()).await?;
    w.write_all(&json).await
}

/// Reads one JSON frame; malformed input is an `InvalidData` error.
pub async fn read_frame<R: AsyncRead + Unpin, T: for<'de> Deserialize<'de>>(r: &mut R) -> std::io::Result<T> {
    read_frame_within(r, MAX_HEADER_BYTES).await
}

/// Reads one JSON frame of at most `limit` bytes (and never more than [`MAX_HEADER_BYTES`]),
/// refusing a longer one before allocating for it.
pub async fn read_frame_within<R: AsyncRead + Unpin, T: for<'de> Deserialize<'de>>(
    r: &mut R,
    limit: usize,
) -> std::io::Result<T> {
    let limit = limit.min(MAX_HEADER_BYTES);
    let bad = |m: String| std::io::Error::new(std::io::ErrorKind::InvalidData, m);
    let mut head = [0u8; 8];
    r.read_exact(&mut head).await?;
    if &head[..4] != MAGIC {
        return Err(bad("not a KV transfer frame".into()));
    }
    let len = u32::from_be_bytes([head[4], head[5], head[6], head[7]]) as usize;
    if len > limit {
        return Err(bad(format!("a {len}-byte frame header is over the {limit}-byte limit")));
    }
    let mut json = vec![0u8; len];
    r.read_exact(&mut json).await?;
    serde_json::from_slice(&json).map_err(|e| bad(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_round_trip_and_garbage_is_refused() {
        let req = FetchRequest { version: VERSION, key: "room-1".into(), model: "m".into(), wait_ms: 250 };
        let mut buf = Vec::new();
        write_frame(&mut buf, &req).await.unwrap();
        let back: FetchRequest = read_frame(&mut buf.as_slice()).await.unwrap();
        assert_eq!(back, req);
        let mut garbage = b"GET / HTTP/1.1\r\n\r\n".as_slice();
        let err = read_frame::<_, FetchRequest>(&mut garbage).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
        let mut huge = Vec::from(&MAGIC[..]);
        huge.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(read_frame::<_, FetchRequest>(&mut huge.as_slice()).await.is_err());
        let err = read_frame_within::<_, FetchRequest>(&mut buf.as_slice(), 8).await.unwrap_err();
        assert!(err.to_string().contains("8-byte limit"), "{err}");
    }
}
