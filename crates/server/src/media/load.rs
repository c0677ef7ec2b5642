//! An image part's bytes, whichever URL brought them: a `data:` URL is decoded here (its MIME
//! type checked against the bytes' magic), `http(s)://` is fetched ([`super::fetch`]) and
//! `file://` read ([`super::local`]) only where the flags allow; anything else is refused.
//! The count of images is checked before any of them is loaded.

use pagoda_media::parse_data_url;

use super::error::MediaRefusal;
use super::fetch::Fetcher;
use super::policy::MediaPolicy;
use super::ImageRef;
use crate::error::ApiError;

/// The bytes of one image.
pub async fn load(url: &str, policy: &MediaPolicy, fetcher: &Fetcher) -> Result<Vec<u8>, MediaRefusal> {
    let scheme = url.split_once(':').map(|(s, _)| s.to_ascii_lowercase()).unwrap_or_default();
    match scheme.as_str() {
        "data" => Ok(parse_data_url(url, &policy.limits)?.bytes),
        "http" | "https" | "file" => {
            let parsed = reqwest::Url::parse(url).map_err(|e| MediaRefusal::BadUrl(e.to_string()))?;
            if scheme == "file" {
                let root = policy.settings.local_root.clone();
                let limits = policy.limits;
                // File reads block: off the async runtime.
                tokio::task::spawn_blocking(move || {
                    super::local::read_file_url(&parsed, root.as_deref(), &limits)
                })
                .await
                .map_err(|e| MediaRefusal::LocalRead(e.to_string()))?
            } else {
                fetcher.fetch(parsed, policy).await
            }
        }
        "" => Err(MediaRefusal::BadUrl("expected a data: URL or an http(s):// or file:// URL".into())),
        other => Err(MediaRefusal::Scheme(other.chars().take(32).collect())),
    }
}

/// The bytes of every image of a request, in order; the first refusal names its part.
pub async fn load_all(
    images: &[ImageRef],
    policy: &MediaPolicy,
    fetcher: &Fetcher,
) -> Result<Vec<Vec<u8>>, ApiError> {
    if let Err(e) = policy.limits.check_image_count(images.len()) {
        // Named at the first image over the limit.
        let param = images.get(policy.limits.max_images_per_request).map_or("messages", |i| i.param.as_str());
        return Err(MediaRefusal::from(e).at(param));
    }
    let mut out = Vec::with_capacity(images.len());
    for image in images {
        out.push(load(&image.url, policy, fetcher).await.map_err(|e| e.at(&image.param))?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::media::policy::MediaSettings;
    use pagoda_media::MediaError;

    fn run<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
    }

    #[test]
    fn schemes() {
        let policy = MediaPolicy::new(MediaSettings::default());
        let fetcher = Fetcher::new().unwrap();
        let load = |url: &str| run(load(url, &policy, &fetcher));
        assert_eq!(load("data:image/png;base64,iVBORw0KGgo="), Ok(b"\x89PNG\r\n\x1a\n".to_vec()));
        assert_eq!(load("http://example.com/a.png"), Err(MediaRefusal::RemoteOff));
        assert_eq!(load("file:///etc/passwd"), Err(MediaRefusal::LocalOff));
        assert_eq!(load("ftp://example.com/a.png"), Err(MediaRefusal::Scheme("ftp".into())));
        assert!(matches!(load("a.png"), Err(MediaRefusal::BadUrl(_))));
        assert!(matches!(load("http://"), Err(MediaRefusal::BadUrl(_))));
        assert_eq!(
            load("data:image/svg+xml;base64,PHN2Zz4="),
            Err(MediaError::UnsupportedFormat("SVG").into())
        );
    }

    #[test]
    fn too_many_images_names_the_first_extra() {
        let policy = MediaPolicy::new(MediaSettings { max_images: 1, ..MediaSettings::default() });
        let fetcher = Fetcher::new().unwrap();
        let refs: Vec<ImageRef> = (0..2)
            .map(|i| ImageRef { param: format!("p{i}"), url: "data:image/png;base64,iVBORw0KGgo=".into() })
            .collect();
        let err = run(load_all(&refs, &policy, &fetcher)).unwrap_err();
        assert_eq!(err.param(), Some("p1"));
        assert!(err.to_string().contains("2 images in one request, over the limit of 1"), "{err}");
        assert_eq!(run(load_all(&refs[..1], &policy, &fetcher)).unwrap().len(), 1);
        let bad = [ImageRef { param: "x.image_url".into(), url: "ftp://h/a".into() }];
        assert_eq!(run(load_all(&bad, &policy, &fetcher)).unwrap_err().param(), Some("x.image_url"));
    }
}
