//! The committed `include/kvshare.h` must be exactly what the pinned cbindgen generates from the
//! sources, and its version macros must match `Cargo.toml` and the library.
//!
//! Regenerate with `KVS_BLESS=1 cargo test --test header`.

use std::ffi::CStr;
use std::path::Path;

fn generate() -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut config =
        cbindgen::Config::from_file(root.join("cbindgen.toml")).expect("cbindgen.toml");
    config.after_includes = Some(version_macros(env!("CARGO_PKG_VERSION")));
    let mut out = Vec::new();
    cbindgen::Builder::new()
        .with_crate(root)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header")
        .write(&mut out);
    String::from_utf8(out).expect("utf-8 header")
}

/// The header's version macros, from Cargo's package version (the workspace's): the header, the
/// library's `kvs_version()`, pkg-config, CMake and the Python packages all take it from there.
fn version_macros(version: &str) -> String {
    let parts: Vec<&str> = version.split(['.', '-', '+']).collect();
    format!(
        "#define KVS_VERSION_MAJOR {}\n#define KVS_VERSION_MINOR {}\n#define KVS_VERSION_PATCH {}\n\
         #define KVS_VERSION \"{version}\"\n",
        parts[0], parts[1], parts[2]
    )
}

#[test]
fn header_is_fresh() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../include/kvshare.h");
    let generated = generate();
    if std::env::var_os("KVS_BLESS").is_some() {
        std::fs::write(&path, &generated).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "include/kvshare.h is stale: run `KVS_BLESS=1 cargo test --test header` and commit it"
    );
}

#[test]
fn version_macros_match_cargo_and_library() {
    let header = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../include/kvshare.h"),
    )
    .unwrap();
    let v = env!("CARGO_PKG_VERSION");
    let parts: Vec<&str> = v.split('.').collect();
    for (name, want) in [
        ("MAJOR", parts[0]),
        ("MINOR", parts[1]),
        ("PATCH", parts[2]),
    ] {
        assert!(
            header.contains(&format!("#define KVS_VERSION_{name} {want}\n")),
            "KVS_VERSION_{name} != {want}"
        );
    }
    assert!(header.contains(&format!("#define KVS_VERSION \"{v}\"\n")));
    // SAFETY: `kvs_version` returns a static NUL-terminated string.
    let lib = unsafe { CStr::from_ptr(kvshare::version::kvs_version()) };
    assert_eq!(lib.to_str().unwrap(), v);
    let abi = kvshare::version::kvs_abi_version();
    assert!(
        header.contains(&format!("#define KVS_ABI_VERSION {abi}\n")),
        "KVS_ABI_VERSION != {abi}"
    );
}

/// Every identifier `include/kvshare.h` declares at file scope: macros, struct/enum tags,
/// enumerators, typedef names and functions. Struct fields and parameter names are scoped and
/// left out. A small tokenizer suffices: the header is generated C with no nested macros.
fn header_identifiers(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    // Comments out; `#` lines give macro names and are dropped.
    let mut code = String::new();
    let mut rest = text;
    while let Some(i) = rest.find("/*") {
        code.push_str(&rest[..i]);
        let end = rest[i..].find("*/").expect("closed comment") + i + 2;
        rest = &rest[end..];
    }
    code.push_str(rest);
    let mut lines = String::new();
    for line in code.lines() {
        let l = line.trim_start();
        if let Some(d) = l.strip_prefix('#') {
            let d = d.trim_start();
            if let Some(m) = d.strip_prefix("define") {
                let name: String = m
                    .trim_start()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                names.push(name);
            }
            continue;
        }
        if l.starts_with("//") {
            continue;
        }
        lines.push_str(line);
        lines.push('\n');
    }
    // Tokens: identifiers, numbers, and single punctuation characters.
    let mut toks: Vec<String> = Vec::new();
    let mut chars = lines.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
        } else if c.is_alphanumeric() || c == '_' {
            let mut t = String::new();
            while let Some(&c) = chars.peek() {
                if c.is_alphanumeric() || c == '_' {
                    t.push(c);
                    chars.next();
                } else {
                    break;
                }
            }
            toks.push(t);
        } else if c == '"' {
            chars.next();
            for c in chars.by_ref() {
                if c == '"' {
                    break;
                }
            }
            toks.push("\"\"".into());
        } else {
            toks.push(c.to_string());
            chars.next();
        }
    }
    let is_ident = |t: &str| {
        t.chars()
            .next()
            .is_some_and(|c| c.is_alphabetic() || c == '_')
    };
    // Walk statements at file scope (`extern "C" {` blocks are transparent).
    let mut i = 0;
    let mut depth = 0usize; // braces inside a declaration
    let mut stmt: Vec<&str> = Vec::new();
    let mut enum_body = false;
    let mut expect_enumerator = false;
    while i < toks.len() {
        let t = toks[i].as_str();
        i += 1;
        if depth == 0 && t == "extern" && toks.get(i).map(String::as_str) == Some("\"\"") {
            i += 2; // extern "C" {
            continue;
        }
        if depth == 0 && stmt.is_empty() && t == "}" {
            continue; // end of extern "C"
        }
        match t {
            "{" => {
                if depth == 0 {
                    enum_body = stmt.contains(&"enum");
                    expect_enumerator = enum_body;
                }
                depth += 1;
                stmt.push(t);
                continue;
            }
            "}" => {
                depth -= 1;
                enum_body = enum_body && depth > 0;
                stmt.push(t);
                continue;
            }
            _ => {}
        }
        if depth == 1 && enum_body {
            if expect_enumerator && is_ident(t) {
                names.push(t.to_string());
                expect_enumerator = false;
            } else if t == "," {
                expect_enumerator = true;
            }
            continue;
        }
        if depth > 0 {
            continue;
        }
        if t != ";" {
            stmt.push(t);
            continue;
        }
        // One file-scope declaration ends.
        for w in stmt.windows(2) {
            if matches!(w[0], "struct" | "enum" | "union") && is_ident(w[1]) {
                names.push(w[1].to_string());
            }
        }
        if stmt.first() == Some(&"typedef") {
            // The declarator: `(*name)(...)` for function pointers, else the last identifier.
            let fnptr = stmt.windows(3).find(|w| w[0] == "(" && w[1] == "*");
            match fnptr {
                Some(w) => names.push(w[2].to_string()),
                None => {
                    let last = stmt
                        .iter()
                        .rev()
                        .find(|t| is_ident(t))
                        .expect("typedef name");
                    names.push(last.to_string());
                }
            }
        } else if let Some(p) = stmt.iter().position(|&t| t == "(") {
            if p > 0 && is_ident(stmt[p - 1]) {
                names.push(stmt[p - 1].to_string());
            }
        }
        stmt.clear();
    }
    names.sort();
    names.dedup();
    names
}

/// Everything the header defines carries the `KVS_`/`kvs_` prefix (the
/// include guard `KVS_H` too), so it can sit next to CANN's, MindIE's or an engine's own names.
#[test]
fn every_header_identifier_is_prefixed() {
    let header = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../include/kvshare.h"),
    )
    .unwrap();
    let names = header_identifiers(&header);
    // The walker must see the header's main kinds of names, or it checks nothing.
    for expected in [
        "KVS_H",
        "KVS_ABI_VERSION",
        "kvs_cache",
        "kvs_status",
        "KVS_STATUS_OK",
        "kvs_cache_new",
        "kvs_config_default",
        "KVS_TIER_DEVICE",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "walker missed {expected}"
        );
    }
    assert!(names.len() > 100, "only {} names found", names.len());
    let bad: Vec<&String> = names
        .iter()
        .filter(|n| !n.starts_with("KVS_") && !n.starts_with("kvs_"))
        .collect();
    assert!(bad.is_empty(), "unprefixed names in kvshare.h: {bad:?}");
}

/// The walker itself: a header with one name of each kind, two of them unprefixed.
#[test]
fn header_walker_finds_each_kind() {
    let text = "/* c */\n#define KVS_A 1\n#define ACL_SUCCESS 0\n#ifdef __cplusplus\nextern \
                \"C\" {\n#endif\ntypedef enum kvs_e { KVS_E_X = 1, KVS_E_Y, MAX_GROUP = 3 } kvs_e;\n\
                typedef struct kvs_s { uint32_t field; } kvs_s;\ntypedef void (*kvs_cb)(int x);\n\
                kvs_status kvs_f(const struct kvs_s *p, size_t n);\n#ifdef __cplusplus\n}\n#endif\n";
    assert_eq!(
        header_identifiers(text),
        [
            "ACL_SUCCESS",
            "KVS_A",
            "KVS_E_X",
            "KVS_E_Y",
            "MAX_GROUP",
            "kvs_cb",
            "kvs_e",
            "kvs_f",
            "kvs_s"
        ]
    );
}

/// Every function returning `kvs_status` documents its failures, and a failure the library cannot
/// detect is no failure to document: no call can tell a freed handle from a live one (reading it
/// would read freed memory), so no **Failure:** clause may promise a status for one (`NULL or
/// freed `x``). Each comment block's clause runs to the next `**` heading or the end of the
/// block.
#[test]
fn failure_clauses_cover_every_status_and_promise_none_for_a_freed_handle() {
    let header = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../include/kvshare.h"),
    )
    .unwrap();
    let mut clauses = 0;
    let mut fallible = 0;
    for block in header.split("/*").skip(1) {
        let mut parts = block.splitn(2, "*/");
        let (block, after) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        let decl = after.trim_start();
        if decl.starts_with("kvs_status kvs_") {
            fallible += 1;
            let name = decl.split('(').next().unwrap_or(decl);
            assert!(
                block.contains("**Failure:**"),
                "{name} returns a status but documents no **Failure:**"
            );
        }
        let Some(at) = block.find("**Failure:**") else {
            continue;
        };
        let rest = &block[at + "**Failure:**".len()..];
        let clause = &rest[..rest.find("**").unwrap_or(rest.len())];
        let clause = clause.split_whitespace().collect::<Vec<_>>().join(" ");
        clauses += 1;
        assert!(
            !clause.contains("freed `"),
            "a failure clause promises a status for a freed handle: {clause}"
        );
    }
    assert!(
        fallible > 40 && clauses >= fallible,
        "{clauses} failure clauses for {fallible} functions returning a status"
    );
}
