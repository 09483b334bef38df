//! The documentation a user reads holds: the README's commands and configuration
//! work as written, every link of the README, the changelog and the book leads to a
//! file and a heading that exist, and every chapter is in the book's table of
//! contents.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

use mssql_ces::config::Config;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every Markdown file of the book, the README and the changelog.
fn documents() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("docs/src") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let mut out = vec![root().join("README.md"), root().join("CHANGELOG.md")];
    walk(&root().join("docs/src"), &mut out);
    out.sort();
    out
}

/// A heading's anchor as mdBook and GitHub make it: lower case, letters, digits,
/// `-` and `_` kept, spaces as `-`, the rest dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The lines outside fenced code blocks.
fn prose(text: &str) -> Vec<&str> {
    let mut fenced = false;
    text.lines()
        .filter(|line| {
            if line.starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    prose(text)
        .into_iter()
        .filter_map(|line| {
            let hashes = line.chars().take_while(|c| *c == '#').count();
            (1..=6)
                .contains(&hashes)
                .then(|| line[hashes..].strip_prefix(' '))
                .flatten()
                .map(anchor)
        })
        .collect()
}

/// `[text](target)` targets of a text's prose, web addresses left out.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose(text) {
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            let target = &after[..end];
            if !target.contains("://") && !target.starts_with("mailto:") {
                out.push(target.to_owned());
            }
            rest = &after[end..];
        }
    }
    out
}

fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

#[test]
fn every_link_leads_to_a_file_and_a_heading_that_exist() {
    let documents = documents();
    let headings: BTreeMap<PathBuf, BTreeSet<String>> = documents
        .iter()
        .map(|d| (normalize(d), anchors(&read(d))))
        .collect();
    let mut broken = Vec::new();
    let mut checked = 0;
    for document in &documents {
        for target in links(&read(document)) {
            checked += 1;
            let (path, fragment) = target.split_once('#').unwrap_or((&target, ""));
            let file = if path.is_empty() {
                normalize(document)
            } else {
                normalize(&document.parent().expect("a folder").join(path))
            };
            if !file.exists() {
                broken.push(format!("{}: {target} (no such file)", document.display()));
            } else if !fragment.is_empty()
                && headings.get(&file).is_some_and(|a| !a.contains(fragment))
            {
                broken.push(format!(
                    "{}: {target} (no such heading)",
                    document.display()
                ));
            }
        }
    }
    assert!(checked > 50, "{checked} links");
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

#[test]
fn every_chapter_is_in_the_table_of_contents() {
    let src = root().join("docs/src");
    let summary = read(&src.join("SUMMARY.md"));
    let listed: BTreeSet<PathBuf> = links(&summary)
        .iter()
        .map(|l| normalize(&src.join(l)))
        .collect();
    let chapters: BTreeSet<PathBuf> = documents()
        .into_iter()
        .filter(|d| d.starts_with(&src) && !d.ends_with("SUMMARY.md"))
        .map(|d| normalize(&d))
        .collect();
    assert_eq!(listed, chapters);
    assert!(read(&root().join("docs/book.toml")).contains("src = \"src\""));
}

/// The README is a front door: short, its configuration loads, and its test
/// command is what CI runs.
#[test]
fn the_readme_is_short_its_configuration_loads_and_its_test_command_is_ci_s() {
    let readme = read(&root().join("README.md"));
    let lines = readme.lines().count();
    assert!(lines <= 250, "the README has {lines} lines");
    let blocks: Vec<String> = readme
        .split("```")
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect();
    let toml = blocks
        .iter()
        .find_map(|b| b.strip_prefix("toml\n"))
        .expect("a configuration in the README");
    let env = vec![
        (
            "MSSQL_CES_CONNECTION_STRING".to_owned(),
            "Server=tcp:db,1433;Database=Shop;User Id=u;Password=p".to_owned(),
        ),
        ("KAFKA_PASSWORD".to_owned(), "p".to_owned()),
    ];
    let config = Config::from_parts(toml, &env, &[]).unwrap_or_else(|e| panic!("{e}\n{toml}"));
    assert!(
        matches!(config.sink.kind, mssql_ces::sink::SinkConfig::Kafka(ref k) if k.exactly_once),
        "{:?}",
        config.sink.kind
    );
    // The configurations the quickstart runs are shipped.
    for example in ["synthetic", "file", "kafka", "local"] {
        assert!(
            readme.contains(&format!("examples/{example}.toml"))
                && root().join(format!("examples/{example}.toml")).exists(),
            "{example}"
        );
    }
    let ci = read(&root().join(".ci/run"));
    assert!(ci.contains("exec bash tests/run"), "{ci}");
    assert!(
        blocks.iter().any(|b| b.trim() == "sh\nbash tests/run"),
        "the README shows the test command alone"
    );
}

/// The workflow a fork's CI runs parses as YAML, runs the README's test command,
/// and runs the SQL Server suite with the README's own commands.
#[test]
fn the_ci_workflow_parses_and_runs_the_readme_s_commands() {
    let text = read(&root().join(".github/workflows/ci.yml"));
    let workflow: serde_yaml::Value = serde_yaml::from_str(&text).expect("valid YAML");
    let runs = |job: &str| -> Vec<String> {
        workflow["jobs"][job]["steps"]
            .as_sequence()
            .unwrap_or_else(|| panic!("job {job} has steps"))
            .iter()
            .filter_map(|step| step["run"].as_str().map(str::to_owned))
            .collect()
    };
    assert_eq!(runs("test"), ["bash tests/run"]);
    let sqlserver = runs("sqlserver");
    let readme = read(&root().join("README.md"));
    for command in [
        "docker compose up -d --wait",
        "cargo test --test sqlserver -- --ignored",
    ] {
        assert!(sqlserver.iter().any(|r| r == command), "{sqlserver:?}");
        assert!(readme.contains(command), "the README gives {command}");
    }
    assert!(sqlserver.iter().any(|r| r.starts_with("docker build")));
}
