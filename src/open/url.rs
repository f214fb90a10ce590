//! A source given as a URL: what it names, understood once from the URL itself
//! ([`SourceUrl`]: the store, from [`crate::storage::object::is_url`]; the shape, from its
//! path), with no request. Every later step (discovery, the openers) takes the [`SourceUrl`],
//! never the string's prefixes.

/// What a source URL names, decided from the URL alone (no request).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    /// Ends with `/`: a prefix of a bucket store (`bucket`: listed page by page), or a
    /// directory of an HTTP server.
    Prefix { bucket: bool },
    /// A brace pattern naming several objects (`…/part-{0..9}.tar`).
    Pattern,
    /// One object: a pack, or one object in another format.
    Object,
}

/// A source URL, understood once.
#[derive(Debug, Clone)]
pub(crate) struct SourceUrl {
    /// The URL as given.
    pub url: String,
    pub shape: Shape,
}

impl SourceUrl {
    /// `src` as a source URL; `None` when no store reads it (a local path).
    pub(crate) fn parse(src: &str) -> Option<SourceUrl> {
        if !crate::storage::object::is_url(src) {
            return None;
        }
        let shape = if src.ends_with('/') {
            Shape::Prefix {
                bucket: crate::storage::object::is_bucket_url(src),
            }
        } else if src.contains('{') {
            Shape::Pattern
        } else {
            Shape::Object
        };
        Some(SourceUrl {
            url: src.to_string(),
            shape,
        })
    }

    /// Whether it names a dataset of several objects (a prefix or a brace pattern) rather
    /// than one object.
    pub(crate) fn names_many(&self) -> bool {
        self.shape != Shape::Object
    }

    /// Whether it is a prefix of a bucket store, listed page by page.
    pub(crate) fn is_bucket_prefix(&self) -> bool {
        self.shape == (Shape::Prefix { bucket: true })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_is_read_once_into_its_shape() {
        for (src, shape) in [
            ("s3://b/train/", Some(Shape::Prefix { bucket: true })),
            ("https://h/train/", Some(Shape::Prefix { bucket: false })),
            ("s3://b/part-{0..3}.tar", Some(Shape::Pattern)),
            ("s3://b/train.pack", Some(Shape::Object)),
            ("/data/train/", None),
        ] {
            assert_eq!(SourceUrl::parse(src).map(|s| s.shape), shape, "{src}");
        }
    }
}
