//! Renders the `structured` target's corpus (arbitrary-encoded inputs) to the JSON
//! frames the target checks, for the stable replay test:
//!
//! ```text
//! cd fuzz && cargo run --example render_structured -- corpus/structured rendered/structured
//! ```
//!
//! Inputs that `arbitrary` cannot decode (the target skips them too) are left out.

use std::path::PathBuf;

use arbitrary::{Arbitrary, Unstructured};

fn main() -> std::io::Result<()> {
    let mut args = std::env::args_os().skip(1).map(PathBuf::from);
    let (Some(from), Some(to)) = (args.next(), args.next()) else {
        eprintln!("usage: render_structured <corpus dir> <output dir>");
        std::process::exit(2);
    };
    if to.exists() {
        std::fs::remove_dir_all(&to)?;
    }
    std::fs::create_dir_all(&to)?;
    let (mut wrote, mut skipped) = (0, 0);
    for entry in std::fs::read_dir(&from)? {
        let path = entry?.path();
        let data = std::fs::read(&path)?;
        // As libfuzzer-sys decodes a typed input.
        match ringrpc_fuzz::Input::arbitrary_take_rest(Unstructured::new(&data)) {
            Ok(input) => {
                let name = path.file_name().unwrap_or_default().to_string_lossy();
                std::fs::write(to.join(format!("{name}.json")), input.render())?;
                wrote += 1;
            }
            Err(_) => skipped += 1,
        }
    }
    println!("rendered {wrote} inputs, skipped {skipped} that do not decode");
    Ok(())
}
