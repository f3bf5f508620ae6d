//! JSON Web Tokens (HS256) for `--jwt-secret`.
