//! ABI stability: what a program compiled against `include/kvshare.h` relies on, recorded per
//! ABI version in `tests/abi/abi-<KVS_ABI_VERSION>.txt` and compared with this build.
//!
//! The record, one fact a line, sorted:
//! * `symbol NAME`: each symbol `libkvshare.so` exports (`nm -D --defined-only`);
//! * `function NAME(TYPES) -> TYPE`: each prototype of the header, parameter names dropped;
//! * `struct NAME size=S align=A` and `field NAME.FIELD offset=O size=S`: every `#[repr(C)]`
//!   struct, measured by a C program compiled against the header (so it is the C compiler's
//!   layout, not Rust's idea of it);
//! * `type NAME size=S`: every typedef (the enums travel as `uint32_t`);
//! * `value NAME = V`: every enumerator and integer `KVS_` macro (not the version macros).
//!
//! The rules (docs/api.md, "ABI stability"):
//! * a fact **removed or changed** (a symbol gone, a parameter type, a size, an offset, an enum
//!   value) breaks programs built against the old header: bump `KVS_ABI_VERSION`
//!   (`crates/libkvshare/src/version.rs`), which is also the SONAME's number, then record the
//!   new version with `KVS_BLESS=1 cargo test --test abi` (it writes `tests/abi/abi-<new>.txt`);
//! * a fact **added** (a new function, enum value or struct) keeps old programs working: record it
//!   with `KVS_BLESS=1` under the same version.
//!
//! `KVS_BLESS=1` refuses to record a removal or change under a released version, so the only way
//! past a break is the version bump. Until the first release of an ABI version (every CHANGELOG
//! section of its versions still "unreleased"), no library of it has shipped: its record may
//! still change.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

fn abi_version() -> u32 {
    kvshare::version::kvs_abi_version()
}

/// Whether no release of ABI `version` has shipped: the CHANGELOG has sections of its versions
/// (0.`version`.x before 1.0, `version`.x.y from 1.0 on) and every one is "(unreleased)".
fn unreleased(version: u32) -> bool {
    let log = std::fs::read_to_string(root().join("CHANGELOG.md")).unwrap();
    let mut of_version = log.lines().filter_map(|l| {
        let rest = l.strip_prefix("## ")?;
        let mut nums = rest.split(|c: char| !c.is_ascii_digit());
        let major: u32 = nums.next()?.parse().ok()?;
        let minor: u32 = nums.next()?.parse().ok()?;
        let abi = if major == 0 { minor } else { major };
        (abi == version).then(|| rest.ends_with("(unreleased)"))
    });
    let first = of_version.next();
    first == Some(true) && of_version.all(|u| u)
}

fn record_path(version: u32) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/abi/abi-{version}.txt"))
}

/// The `libkvshare.so` cargo built for this run (next to this test executable, or one up).
fn cdylib() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    [deps, deps.parent().unwrap_or(deps)]
        .iter()
        .map(|d| d.join("libkvshare.so"))
        .find(|p| p.is_file())
        .expect("libkvshare.so not found next to the test executable: Cargo.toml must keep crate-type cdylib")
}

/// The header with comments and preprocessor lines removed; integer `#define`s collected apart.
fn strip_header(text: &str) -> (String, Vec<String>) {
    let mut out = String::new();
    let mut macros = Vec::new();
    let mut rest = text;
    // Comments first (they may span lines).
    let mut no_comments = String::new();
    while let Some(i) = rest.find("/*") {
        no_comments.push_str(&rest[..i]);
        let end = rest[i..].find("*/").expect("unclosed comment") + i + 2;
        rest = &rest[end..];
    }
    no_comments.push_str(rest);
    // `#if` branches taken, innermost last.
    let mut stack: Vec<bool> = Vec::new();
    for line in no_comments.lines() {
        let line = match line.find("//") {
            Some(i) => &line[..i],
            None => line,
        };
        let t = line.trim();
        if stack.iter().any(|active| !active) && !t.starts_with('#') {
            continue;
        }
        if let Some(def) = t.strip_prefix("#define ") {
            let mut parts = def.splitn(2, char::is_whitespace);
            let name = parts.next().unwrap_or_default();
            let value = parts.next().unwrap_or_default().trim();
            let is_version = name.starts_with("KVS_VERSION") || name == "KVS_ABI_VERSION";
            if name.starts_with("KVS_") && !is_version && !value.is_empty() {
                macros.push(name.to_string());
            }
            continue;
        }
        if let Some(d) = t.strip_prefix('#') {
            let d = squash(d);
            if d.starts_with("if") {
                stack.push(c_mode_condition(&d));
            } else if d == "else" {
                let top = stack.last_mut().expect("#else without #if");
                *top = !*top;
            } else if d.starts_with("endif") {
                stack.pop().expect("#endif without #if");
            } else if d.starts_with("elif") {
                panic!("the ABI test's header reader does not handle #elif: {t}");
            }
            continue;
        }
        if stack.iter().any(|active| !active) {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    (out, macros)
}

/// Whether an `#if` line of the generated header holds when a C11 compiler reads it: the C++
/// and C23 branches do not. Any other condition stops the test, so a header the reader does not
/// understand is never measured wrongly.
fn c_mode_condition(directive: &str) -> bool {
    match directive {
        "ifdef __cplusplus" => false,
        "if defined(__cplusplus) || __STDC_VERSION__ >= 202311L" => false,
        "if __STDC_VERSION__ >= 202311L" => false,
        d if d.starts_with("ifndef ") => true,
        d => panic!("the ABI test's header reader does not know `#{d}`"),
    }
}

fn squash(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Top-level declarations (text up to each `;` outside braces).
fn statements(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut depth = 0i32;
    for c in code.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            _ => {}
        }
        if c == ';' && depth == 0 {
            let s = squash(&cur);
            if !s.is_empty() {
                out.push(s);
            }
            cur.clear();
        } else {
            cur.push(c);
        }
    }
    out
}

/// The last identifier of a declaration (`const int32_t *tokens` -> `tokens`, `x[16]` -> `x`).
fn declared_name(decl: &str) -> &str {
    let d = decl.split('[').next().unwrap().trim_end();
    let start = d
        .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .map_or(0, |i| i + 1);
    &d[start..]
}

#[derive(Default)]
struct Header {
    structs: Vec<(String, Vec<String>)>,
    enumerators: Vec<(String, String)>,
    typedefs: Vec<String>,
    /// Handles declared without a body (`typedef struct kvs_cache kvs_cache;`): no size in C.
    opaque: Vec<String>,
    functions: Vec<(String, String)>,
    macros: Vec<String>,
}

fn parse_header(text: &str) -> Header {
    let (code, macros) = strip_header(text);
    let mut h = Header {
        macros,
        ..Header::default()
    };
    for s in statements(&code) {
        let body = |s: &str| {
            let open = s.find('{').unwrap();
            let close = s.rfind('}').unwrap();
            s[open + 1..close].to_string()
        };
        if s.starts_with("typedef struct") && s.contains('{') {
            let name = declared_name(&s[s.rfind('}').unwrap() + 1..]).to_string();
            let fields = body(&s)
                .split(';')
                .map(str::trim)
                .filter(|f| !f.is_empty())
                .map(|f| declared_name(f).to_string())
                .collect();
            h.structs.push((name, fields));
        } else if s.starts_with("enum ") && s.contains('{') {
            let name = s["enum ".len()..]
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .next()
                .unwrap()
                .to_string();
            for e in body(&s).split(',').map(str::trim).filter(|e| !e.is_empty()) {
                let e = e.split('=').next().unwrap().trim();
                h.enumerators.push((name.clone(), e.to_string()));
            }
        } else if let Some(t) = s.strip_prefix("typedef ") {
            if !t.contains('(') {
                let name = declared_name(t).to_string();
                if t.starts_with("struct ") {
                    h.opaque.push(name);
                } else if !h.typedefs.contains(&name) {
                    h.typedefs.push(name);
                }
            }
        } else if s.contains('(') {
            let open = s.find('(').unwrap();
            let head = s[..open].trim();
            let name = declared_name(head).to_string();
            let ret = squash(&head[..head.len() - name.len()]);
            let params = &s[open + 1..s.rfind(')').unwrap()];
            let types: Vec<String> = params
                .split(',')
                .map(str::trim)
                .map(|p| {
                    if p == "void" || p.is_empty() {
                        p.to_string()
                    } else {
                        let n = declared_name(p);
                        squash(&p[..p.len() - n.len()]).replace(" *", "*")
                    }
                })
                .collect();
            let ret = ret.replace(" *", "*");
            h.functions.push((
                name.clone(),
                format!("{name}({}) -> {ret}", types.join(", ")),
            ));
        }
    }
    h
}

/// Compiles and runs a C program that prints the layouts and values the header declares.
fn measure_from_c(h: &Header) -> Vec<String> {
    let mut c = String::from(
        "#include <stddef.h>\n#include <stdio.h>\n#include \"kvshare.h\"\n\
         #define FIELD(T, F) printf(\"field %s.%s offset=%zu size=%zu\\n\", #T, #F, \
         offsetof(T, F), sizeof(((T *)0)->F))\n\
         #define VALUE(N) printf(\"value %s = %lld\\n\", #N, (long long)(N))\n\
         int main(void) {\n",
    );
    for (name, fields) in &h.structs {
        c.push_str(&format!(
            "  printf(\"struct {name} size=%zu align=%zu\\n\", sizeof({name}), _Alignof({name}));\n"
        ));
        for f in fields {
            c.push_str(&format!("  FIELD({name}, {f});\n"));
        }
    }
    for t in &h.typedefs {
        c.push_str(&format!(
            "  printf(\"type {t} size=%zu\\n\", sizeof({t}));\n"
        ));
    }
    for t in &h.opaque {
        c.push_str(&format!("  printf(\"opaque {t}\\n\");\n"));
    }
    for (_, e) in &h.enumerators {
        c.push_str(&format!("  VALUE({e});\n"));
    }
    for m in &h.macros {
        c.push_str(&format!("  VALUE({m});\n"));
    }
    c.push_str("  return 0;\n}\n");
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("abi");
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("layout.c");
    let exe = dir.join("layout");
    std::fs::write(&src, &c).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Werror", "-I"])
        .arg(root().join("include"))
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cc}: {e}"));
    assert!(
        out.status.success(),
        "the layout program does not compile:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&exe).output().unwrap();
    assert!(run.status.success());
    String::from_utf8(run.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

fn exported_symbols() -> Vec<String> {
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(cdylib())
        .output()
        .expect("nm (binutils) is needed to list the library's symbols");
    assert!(out.status.success());
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace().rev();
            let name = it.next()?;
            let kind = it.next()?;
            // Functions and data; not the linker's own absolute symbols.
            "TDBRV".contains(kind).then(|| name.to_string())
        })
        .collect()
}

type Current = (BTreeSet<String>, Vec<String>, Vec<String>);

/// The current ABI facts, sorted, plus the header's function names and the library's symbols
/// (measured once per test run; the tests share it).
fn current() -> &'static Current {
    static CURRENT: std::sync::OnceLock<Current> = std::sync::OnceLock::new();
    CURRENT.get_or_init(measure_current)
}

fn measure_current() -> Current {
    let text = std::fs::read_to_string(root().join("include/kvshare.h")).unwrap();
    let h = parse_header(&text);
    let mut facts = BTreeSet::new();
    let symbols = exported_symbols();
    for s in &symbols {
        facts.insert(format!("symbol {s}"));
    }
    for (_, f) in &h.functions {
        facts.insert(format!("function {f}"));
    }
    facts.extend(measure_from_c(&h));
    let names = h.functions.iter().map(|(n, _)| n.clone()).collect();
    (facts, names, symbols)
}

#[test]
fn header_functions_and_exported_symbols_agree() {
    let (_, functions, symbols) = current();
    let f: BTreeSet<_> = functions.iter().collect();
    let s: BTreeSet<_> = symbols.iter().collect();
    assert!(
        !f.is_empty(),
        "no function parsed from the header: the parser is broken"
    );
    assert_eq!(
        f.difference(&s).collect::<Vec<_>>(),
        Vec::<&&String>::new(),
        "declared in kvshare.h but not exported by libkvshare.so"
    );
    assert_eq!(
        s.difference(&f).collect::<Vec<_>>(),
        Vec::<&&String>::new(),
        "exported by libkvshare.so but not declared in kvshare.h"
    );
}

#[test]
fn abi_matches_the_record_of_its_version() {
    let version = abi_version();
    let path = record_path(version);
    let (facts, _, _) = current();
    assert!(
        facts.iter().any(|f| f.starts_with("field kvs_config."))
            && facts
                .iter()
                .any(|f| f.starts_with("value KVS_STATUS_OK = 0")),
        "the measurement lost the structs or enums: the header parser is broken"
    );
    let bless = std::env::var_os("KVS_BLESS").is_some();
    let recorded: Option<BTreeSet<String>> = std::fs::read_to_string(&path)
        .ok()
        .map(|t| t.lines().map(str::to_string).collect());
    let Some(recorded) = recorded else {
        if bless {
            write_record(&path, facts);
            return;
        }
        panic!(
            "KVS_ABI_VERSION is {version} but {} does not exist: record it with \
             `KVS_BLESS=1 cargo test --test abi` and commit it",
            path.display()
        );
    };
    let removed: Vec<&String> = recorded.difference(facts).collect();
    let added: Vec<&String> = facts.difference(&recorded).collect();
    if bless && unreleased(version) {
        write_record(&path, facts);
        return;
    }
    assert!(
        removed.is_empty(),
        "the ABI changed without KVS_ABI_VERSION moving (still {version}): these facts of {} \
         no longer hold:\n  {}\nnow:\n  {}\nA program built against the old header would break \
         (a released ABI: its CHANGELOG section is dated). \
         Bump KVS_ABI_VERSION in crates/libkvshare/src/version.rs (the SONAME follows it), then \
         `KVS_BLESS=1 cargo test --test abi` and `KVS_BLESS=1 cargo test --test header`.",
        path.display(),
        removed
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n  "),
        added
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n  ")
    );
    if bless {
        write_record(&path, facts);
        return;
    }
    assert!(
        added.is_empty(),
        "new ABI facts (compatible additions; no version bump needed): record them with \
         `KVS_BLESS=1 cargo test --test abi`:\n  {}",
        added
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n  ")
    );
}

fn write_record(path: &Path, facts: &BTreeSet<String>) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut text = String::new();
    for f in facts {
        text.push_str(f);
        text.push('\n');
    }
    std::fs::write(path, text).unwrap();
}

#[test]
fn parser_reads_structs_enums_and_prototypes() {
    // A header in the generated shape, parsed the same way as the real one.
    let h = parse_header(
        "/* doc */\n#ifndef KVS_H\n#define KVS_X 3\n#define KVS_VERSION \"1\"\n#ifdef __cplusplus\n\
         extern \"C\" {\n#endif\nenum kvs_e\n\
         #if defined(__cplusplus) || __STDC_VERSION__ >= 202311L\n  : uint32_t\n\
         #endif // defined(__cplusplus) || __STDC_VERSION__ >= 202311L\n {\n  /* a */\n  KVS_E_A = 0,\n\
         KVS_E_B = 7,\n};\n#ifndef __cplusplus\n#if __STDC_VERSION__ >= 202311L\n\
         typedef enum kvs_e kvs_e;\n#else\ntypedef uint32_t kvs_e;\n#endif\n#endif\n\
         typedef struct kvs_h kvs_h;\ntypedef struct kvs_s {\n  /* f */\n  uint32_t a;\n\
         const int32_t *p;\n  uint8_t key[16];\n} kvs_s;\n\
         kvs_status kvs_f(const struct kvs_s *s,\n  size_t n, kvs_h **out);\nvoid kvs_g(void);\n#ifdef __cplusplus\n}  // extern \"C\"\n#endif\n#endif\n",
    );
    assert_eq!(h.macros, ["KVS_X"]);
    assert_eq!(
        h.enumerators,
        [
            ("kvs_e".to_string(), "KVS_E_A".to_string()),
            ("kvs_e".to_string(), "KVS_E_B".to_string())
        ]
    );
    assert_eq!(
        h.structs,
        [(
            "kvs_s".to_string(),
            vec!["a".into(), "p".into(), "key".into()]
        )]
    );
    assert_eq!(h.typedefs, ["kvs_e"]);
    assert_eq!(h.opaque, ["kvs_h"]);
    assert_eq!(
        h.functions,
        [
            (
                "kvs_f".to_string(),
                "kvs_f(const struct kvs_s*, size_t, kvs_h**) -> kvs_status".to_string()
            ),
            ("kvs_g".to_string(), "kvs_g(void) -> void".to_string())
        ]
    );
}
