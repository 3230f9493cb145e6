// SPDX-License-Identifier: Apache-2.0
//! Two rules of the project's source, read from the source itself:
//!
//! - no import circle: within each crate of `arch`, `devices`, `vmm`,
//!   `tools` and `fuzz`, the files' references to one another (`use
//!   crate::…`, `use super::…`, and paths such as `crate::x::y` in code and
//!   in macro arguments) form no cycle. A cycle fails the test, named file
//!   by file;
//! - no production function in `arch`, `devices` or `vmm` longer than
//!   [`MAX_FN_LINES`] lines, from its `fn` line to its closing brace
//!   (`#[cfg(test)]` modules and items, and modules compiled only for tests
//!   such as the driver-side harness, are test code and not counted).
//!
//! Each crate is read from its roots (`src/lib.rs`, `src/main.rs`) along
//! its `mod` declarations, so a file belongs to the crate that compiles it.
//! A reference resolves to the file of the deepest module its path names:
//! `crate::config::file::X` is `config/file.rs`, `crate::config::VmmConfig`
//! is `config/mod.rs`. A `mod` declaration is not a reference (a parent
//! names its children without using them); a `pub use` of a child is.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::Visit;

/// The longest production function allowed, in lines.
const MAX_FN_LINES: usize = 80;

/// The crates whose files may not import each other in a circle, by their
/// folder under the repository root.
const CYCLE_CRATES: &[&str] = &[
    "arch",
    "devices",
    "vmm",
    "fuzz/harness",
    "tools/netperf",
    "tools/bench",
];

/// The crates whose production functions are held to [`MAX_FN_LINES`].
const LENGTH_CRATES: &[&str] = &["arch", "devices", "vmm"];

/// Import circles known today, each as the sorted list of its files
/// (relative to the repository root), left to the change that breaks them.
/// A circle listed here that no longer exists fails the test too, so the
/// list only shrinks.
const KNOWN_CYCLES: &[&[&str]] = &[];

/// Functions over the limit known today, as `file: name`, left to the
/// change that splits them; like [`KNOWN_CYCLES`], the list only shrinks.
const KNOWN_LONG_FNS: &[&str] = &[];

/// One file of a crate: its module path and whether only tests compile it.
#[derive(Debug, Clone)]
struct ModFile {
    path: PathBuf,
    module: Vec<String>,
    test_only: bool,
}

/// A crate's files and which module path lives in which file (inline
/// modules map to the file that holds them).
#[derive(Debug, Default)]
struct CrateMap {
    files: Vec<ModFile>,
    modules: HashMap<Vec<String>, usize>,
}

fn repo_root() -> PathBuf {
    minivmm_tests::repo_root()
}

fn parse(path: &Path) -> syn::File {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    syn::parse_file(&text).unwrap_or_else(|e| panic!("cannot parse {}: {e}", path.display()))
}

/// Whether `attrs` hold a `cfg` that compiles the item for tests only:
/// `cfg(test)`, or an `any(...)` naming `test` among features
/// (`cfg(any(test, feature = "test-utils"))`, the driver-side harness).
fn test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<TokenStream>().is_ok_and(|t| {
                let text = t.to_string().replace(' ', "");
                text == "test" || (text.starts_with("any(") && text.contains("test"))
            })
    })
}

/// The files a module's `mod name;` items load: `dir` is where a child of
/// the module is looked for (`src/` for a root or a `mod.rs`, the file's
/// own folder otherwise).
fn child_files(
    items: &[syn::Item],
    dir: &Path,
    module: &[String],
    test: bool,
    out: &mut Vec<(PathBuf, Vec<String>, bool)>,
) {
    for item in items {
        let syn::Item::Mod(m) = item else { continue };
        let name = m.ident.to_string();
        let mut child = module.to_vec();
        child.push(name.clone());
        let test = test || test_only(&m.attrs);
        match &m.content {
            // An inline module: its own children live in `dir/name/`.
            Some((_, inner)) => child_files(inner, &dir.join(&name), &child, test, out),
            None => {
                let flat = dir.join(format!("{name}.rs"));
                let nested = dir.join(&name).join("mod.rs");
                let file = if flat.exists() { flat } else { nested };
                out.push((file, child, test));
            }
        }
    }
}

/// Reads a crate from its roots along its `mod` declarations.
fn crate_map(krate: &Path) -> CrateMap {
    let mut map = CrateMap::default();
    let mut todo: Vec<(PathBuf, Vec<String>, bool)> = ["src/lib.rs", "src/main.rs"]
        .iter()
        .map(|r| krate.join(r))
        .filter(|p| p.exists())
        .map(|p| (p, Vec::new(), false))
        .collect();
    // A lib and a bin in one crate are two module trees; the bin's files
    // are told apart by a root segment of their own.
    let both = todo.len() == 2;
    if both {
        todo[1].1 = vec!["<bin>".to_string()];
    }
    while let Some((path, module, test)) = todo.pop() {
        let ast = parse(&path);
        let index = map.files.len();
        map.modules.insert(module.clone(), index);
        inline_modules(&ast.items, &module, index, &mut map.modules);
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let dir = if matches!(name, "lib.rs" | "main.rs" | "mod.rs") {
            path.parent().expect("a file has a folder").to_path_buf()
        } else {
            path.with_extension("")
        };
        let mut children = Vec::new();
        child_files(&ast.items, &dir, &module, test, &mut children);
        todo.extend(children);
        map.files.push(ModFile {
            path,
            module,
            test_only: test,
        });
    }
    map
}

/// Records the inline modules of a file under the file's index.
fn inline_modules(
    items: &[syn::Item],
    module: &[String],
    index: usize,
    modules: &mut HashMap<Vec<String>, usize>,
) {
    for item in items {
        if let syn::Item::Mod(m) = item {
            if let Some((_, inner)) = &m.content {
                let mut child = module.to_vec();
                child.push(m.ident.to_string());
                modules.insert(child.clone(), index);
                inline_modules(inner, &child, index, modules);
            }
        }
    }
}

/// Collects the module paths one file refers to: each as the path's
/// segments from the crate root, resolved against the module the
/// reference sits in.
struct Refs<'a> {
    /// The module path of the (inline) module being read.
    module: Vec<String>,
    /// The bin's root segment, when the file belongs to a crate's bin.
    root: &'a [String],
    /// Whether the code being read is compiled for tests only.
    test: bool,
    /// Skip test code (for the production graph).
    skip_test: bool,
    out: Vec<Vec<String>>,
}

impl Refs<'_> {
    /// `segments` (a path as written) from the crate root, if it starts at
    /// `crate`, `super` or `self`.
    fn absolute(&self, segments: &[String]) -> Option<Vec<String>> {
        let mut base = match segments.first()?.as_str() {
            "crate" => self.root.to_vec(),
            "super" | "self" => self.module.clone(),
            _ => return None,
        };
        let mut rest = segments;
        if segments[0] != "crate" {
            while let Some(first) = rest.first() {
                match first.as_str() {
                    "super" => {
                        base.pop();
                    }
                    "self" => {}
                    _ => break,
                }
                rest = &rest[1..];
            }
        } else {
            rest = &rest[1..];
        }
        base.extend(rest.iter().cloned());
        Some(base)
    }

    fn record(&mut self, segments: &[String]) {
        if self.skip_test && self.test {
            return;
        }
        if let Some(abs) = self.absolute(segments) {
            self.out.push(abs);
        }
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                prefix.push(n.ident.to_string());
                let path = prefix.clone();
                self.record(&path);
                prefix.pop();
            }
            syn::UseTree::Rename(r) => {
                prefix.push(r.ident.to_string());
                let path = prefix.clone();
                self.record(&path);
                prefix.pop();
            }
            syn::UseTree::Glob(_) => {
                let path = prefix.clone();
                self.record(&path);
            }
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(prefix, t);
                }
            }
        }
    }

    /// Paths inside a macro's arguments (`info!(target: crate::x::T, ...)`):
    /// every `crate`/`super`/`self` followed by `::` and names.
    fn tokens(&mut self, tokens: TokenStream) {
        let trees: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < trees.len() {
            match &trees[i] {
                TokenTree::Group(g) => self.tokens(g.stream()),
                TokenTree::Ident(id) if ["crate", "super", "self"].contains(&&*id.to_string()) => {
                    let mut segs = vec![id.to_string()];
                    let mut j = i + 1;
                    // `::` is two `:` puncts, then the next name.
                    while let (
                        Some(TokenTree::Punct(a)),
                        Some(TokenTree::Punct(b)),
                        Some(TokenTree::Ident(next)),
                    ) = (trees.get(j), trees.get(j + 1), trees.get(j + 2))
                    {
                        if a.as_char() != ':' || b.as_char() != ':' {
                            break;
                        }
                        segs.push(next.to_string());
                        j += 3;
                    }
                    if segs.len() > 1 {
                        self.record(&segs);
                    }
                    i = j;
                    continue;
                }
                _ => {}
            }
            i += 1;
        }
    }
}

impl<'ast> Visit<'ast> for Refs<'_> {
    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        let test = self.test;
        self.test |= test_only(&u.attrs);
        self.use_tree(&mut Vec::new(), &u.tree);
        self.test = test;
    }

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        let Some((_, items)) = &m.content else {
            return;
        };
        let test = self.test;
        self.test |= test_only(&m.attrs);
        self.module.push(m.ident.to_string());
        for item in items {
            self.visit_item(item);
        }
        self.module.pop();
        self.test = test;
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        let test = self.test;
        self.test |= test_only(&f.attrs) || f.attrs.iter().any(|a| a.path().is_ident("test"));
        syn::visit::visit_item_fn(self, f);
        self.test = test;
    }

    fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
        let test = self.test;
        self.test |= test_only(&i.attrs);
        syn::visit::visit_item_impl(self, i);
        self.test = test;
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segs: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        if segs.len() > 1 {
            self.record(&segs);
        }
        syn::visit::visit_path(self, p);
    }

    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {
        // `pub(in crate::x)` restricts who sees an item; it uses nothing.
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.visit_path(&m.path);
        self.tokens(m.tokens.clone());
    }

    fn visit_attribute(&mut self, _: &'ast syn::Attribute) {
        // Doc comments and lint attributes name no code.
    }
}

/// The file a module path (from the crate root) lives in: that of its
/// longest prefix that is a module.
fn file_of(map: &CrateMap, path: &[String]) -> Option<usize> {
    (0..=path.len())
        .rev()
        .find_map(|n| map.modules.get(&path[..n]).copied())
}

/// The edges between a crate's files: `from -> {to}`, production code only
/// when `skip_test`.
fn edges(map: &CrateMap, skip_test: bool) -> BTreeMap<usize, BTreeSet<usize>> {
    let mut out: BTreeMap<usize, BTreeSet<usize>> = BTreeMap::new();
    for (index, file) in map.files.iter().enumerate() {
        if skip_test && file.test_only {
            continue;
        }
        let ast = parse(&file.path);
        let bin_root = file
            .module
            .first()
            .filter(|s| *s == "<bin>")
            .map(|s| vec![s.clone()])
            .unwrap_or_default();
        let mut refs = Refs {
            module: file.module.clone(),
            root: &bin_root,
            test: false,
            skip_test,
            out: Vec::new(),
        };
        refs.visit_file(&ast);
        for r in refs.out {
            if let Some(to) = file_of(map, &r) {
                if to != index && !(skip_test && map.files[to].test_only) {
                    out.entry(index).or_default().insert(to);
                }
            }
        }
    }
    out
}

/// The strongly connected components of more than one file (Tarjan).
fn cycles(n: usize, edges: &BTreeMap<usize, BTreeSet<usize>>) -> Vec<Vec<usize>> {
    struct State<'a> {
        edges: &'a BTreeMap<usize, BTreeSet<usize>>,
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on_stack: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        out: Vec<Vec<usize>>,
    }
    fn strong(s: &mut State, v: usize) {
        s.index[v] = Some(s.next);
        s.low[v] = s.next;
        s.next += 1;
        s.stack.push(v);
        s.on_stack[v] = true;
        let succ: Vec<usize> = s.edges.get(&v).into_iter().flatten().copied().collect();
        for w in succ {
            match s.index[w] {
                None => {
                    strong(s, w);
                    s.low[v] = s.low[v].min(s.low[w]);
                }
                Some(iw) if s.on_stack[w] => s.low[v] = s.low[v].min(iw),
                Some(_) => {}
            }
        }
        if Some(s.low[v]) == s.index[v] {
            let mut comp = Vec::new();
            loop {
                let w = s.stack.pop().expect("v is on the stack");
                s.on_stack[w] = false;
                comp.push(w);
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                s.out.push(comp);
            }
        }
    }
    let mut s = State {
        edges,
        index: vec![None; n],
        low: vec![0; n],
        on_stack: vec![false; n],
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in 0..n {
        if s.index[v].is_none() {
            strong(&mut s, v);
        }
    }
    s.out
}

/// One concrete circle through a component, from its first file back to
/// it, for the failure message.
fn one_circle(comp: &[usize], edges: &BTreeMap<usize, BTreeSet<usize>>) -> Vec<usize> {
    let inside: BTreeSet<usize> = comp.iter().copied().collect();
    let start = *inside.iter().next().expect("a component has files");
    // Breadth-first from the start's successors back to the start.
    let mut prev: BTreeMap<usize, usize> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start]);
    while let Some(v) = queue.pop_front() {
        for &w in edges.get(&v).into_iter().flatten() {
            if !inside.contains(&w) || prev.contains_key(&w) {
                continue;
            }
            prev.insert(w, v);
            if w == start {
                let mut path = vec![start];
                let mut at = v;
                while at != start {
                    path.push(at);
                    at = prev[&at];
                }
                path.push(start);
                path.reverse();
                return path;
            }
            queue.push_back(w);
        }
    }
    comp.to_vec()
}

fn rel(path: &Path) -> String {
    path.strip_prefix(repo_root())
        .unwrap_or(path)
        .display()
        .to_string()
}

/// Every import circle of the production code, as (sorted files, one
/// circle spelled out).
fn import_cycles() -> Vec<(Vec<String>, String)> {
    let mut found = Vec::new();
    for krate in CYCLE_CRATES {
        let map = crate_map(&repo_root().join(krate));
        let e = edges(&map, true);
        for comp in cycles(map.files.len(), &e) {
            let mut files: Vec<String> = comp.iter().map(|&i| rel(&map.files[i].path)).collect();
            files.sort();
            let circle = one_circle(&comp, &e)
                .iter()
                .map(|&i| rel(&map.files[i].path))
                .collect::<Vec<_>>()
                .join(" -> ");
            found.push((files, circle));
        }
    }
    found
}

#[test]
fn no_file_imports_itself_through_others() {
    let found = import_cycles();
    let known: Vec<Vec<String>> = KNOWN_CYCLES
        .iter()
        .map(|c| c.iter().map(|s| s.to_string()).collect())
        .collect();
    let new: Vec<String> = found
        .iter()
        .filter(|(files, _)| !known.contains(files))
        .map(|(files, circle)| format!("{} files in a circle: {circle}", files.len()))
        .collect();
    let gone: Vec<String> = known
        .iter()
        .filter(|k| !found.iter().any(|(files, _)| files == *k))
        .map(|k| k.join(", "))
        .collect();
    assert!(
        new.is_empty(),
        "import circles among source files:\n{}",
        new.join("\n")
    );
    assert!(
        gone.is_empty(),
        "known circles that no longer exist; remove them from KNOWN_CYCLES:\n{}",
        gone.join("\n")
    );
}

/// Collects the production functions of a file with their lengths.
struct Lengths {
    test: bool,
    owner: Vec<String>,
    out: Vec<(String, usize)>,
}

impl Lengths {
    fn record(&mut self, name: &syn::Ident, fn_token: &syn::token::Fn, block: &syn::Block) {
        if self.test {
            return;
        }
        let first = fn_token.span.start().line;
        let last = block.brace_token.span.close().end().line;
        let mut full = self.owner.clone();
        full.push(name.to_string());
        self.out.push((full.join("::"), last + 1 - first));
    }

    fn with<F: FnOnce(&mut Self)>(&mut self, test: bool, f: F) {
        let was = self.test;
        self.test |= test;
        f(self);
        self.test = was;
    }
}

fn is_test(attrs: &[syn::Attribute]) -> bool {
    test_only(attrs) || attrs.iter().any(|a| a.path().is_ident("test"))
}

impl<'ast> Visit<'ast> for Lengths {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        self.with(test_only(&m.attrs), |s| syn::visit::visit_item_mod(s, m));
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        self.with(is_test(&f.attrs), |s| {
            s.record(&f.sig.ident, &f.sig.fn_token, &f.block);
            syn::visit::visit_item_fn(s, f);
        });
    }

    fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
        let owner = match &*i.self_ty {
            syn::Type::Path(p) => p
                .path
                .segments
                .last()
                .map_or_else(String::new, |s| s.ident.to_string()),
            _ => String::new(),
        };
        self.owner.push(owner);
        self.with(test_only(&i.attrs), |s| syn::visit::visit_item_impl(s, i));
        self.owner.pop();
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        self.with(is_test(&f.attrs), |s| {
            s.record(&f.sig.ident, &f.sig.fn_token, &f.block);
            syn::visit::visit_impl_item_fn(s, f);
        });
    }

    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        if let Some(block) = &f.default {
            self.with(is_test(&f.attrs), |s| {
                s.record(&f.sig.ident, &f.sig.fn_token, block)
            });
        }
        syn::visit::visit_trait_item_fn(self, f);
    }
}

/// Every production function over the limit, as `file: name (N lines)`,
/// and the `file: name` key of each.
fn long_functions() -> Vec<(String, String)> {
    let mut found = Vec::new();
    for krate in LENGTH_CRATES {
        let map = crate_map(&repo_root().join(krate));
        for file in map.files.iter().filter(|f| !f.test_only) {
            let mut v = Lengths {
                test: false,
                owner: Vec::new(),
                out: Vec::new(),
            };
            v.visit_file(&parse(&file.path));
            for (name, lines) in v.out {
                if lines > MAX_FN_LINES {
                    let key = format!("{}: {name}", rel(&file.path));
                    found.push((key.clone(), format!("{key} ({lines} lines)")));
                }
            }
        }
    }
    found
}

#[test]
fn no_production_function_is_longer_than_the_limit() {
    let found = long_functions();
    let new: Vec<&str> = found
        .iter()
        .filter(|(key, _)| !KNOWN_LONG_FNS.contains(&key.as_str()))
        .map(|(_, line)| line.as_str())
        .collect();
    let gone: Vec<&&str> = KNOWN_LONG_FNS
        .iter()
        .filter(|k| !found.iter().any(|(key, _)| key == *k))
        .collect();
    assert!(
        new.is_empty(),
        "production functions over {MAX_FN_LINES} lines (split them along their comments):\n{}",
        new.join("\n")
    );
    assert!(
        gone.is_empty(),
        "known long functions that are short now; remove them from KNOWN_LONG_FNS: {gone:?}"
    );
}

/// The checker itself on a small crate of its own: a circle through three
/// files is found, named, and a `mod` declaration alone is none.
#[test]
fn the_checker_finds_a_circle_and_only_a_circle() {
    let dir = std::env::temp_dir().join(format!("minivmm-source-rules-{}", std::process::id()));
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("a")).unwrap();
    let write = |p: &str, text: &str| std::fs::write(src.join(p), text).unwrap();
    write("lib.rs", "mod a;\nmod b;\nmod c;\npub struct Root;\n");
    write("a/mod.rs", "mod inner;\npub struct A;\n");
    write(
        "a/inner.rs",
        "pub fn f() { log::info!(target: crate::b::T, \"x\"); }\n",
    );
    write("b.rs", "pub const T: &str = \"\";\nuse super::c::C;\n");
    write(
        "c.rs",
        "pub struct C;\nfn g() { let _ = crate::a::inner::f; }\n#[cfg(test)]\nmod tests { use crate::Root; }\n",
    );
    let map = crate_map(&dir);
    assert_eq!(map.files.len(), 5);
    let name = |i: usize| rel(&map.files[i].path).replace(&rel(&src), "");
    let e = edges(&map, true);
    let found = cycles(map.files.len(), &e);
    assert_eq!(found.len(), 1, "{found:?}");
    let mut files: Vec<String> = found[0].iter().map(|&i| name(i)).collect();
    files.sort();
    assert_eq!(files, ["/a/inner.rs", "/b.rs", "/c.rs"]);
    assert_eq!(one_circle(&found[0], &e).len(), 4);
    // The test module's reference to the root is no production edge.
    assert!(!e.values().flatten().any(|&to| name(to) == "/lib.rs"));
    assert!(edges(&map, false)
        .values()
        .flatten()
        .any(|&to| name(to) == "/lib.rs"));
    std::fs::remove_dir_all(&dir).unwrap();
}
