//! The generated CRD: the file in `crds/` (and the chart's copy) is current; names,
//! printer columns, list-map conditions.

use super::*;

/// `crds/` holds exactly what `crd_yaml()` and `admission_config_crd_yaml()` generate.
/// `LOCKWARDEN_UPDATE_CRDS=1` rewrites the files, and the Helm chart's copies of them,
/// instead of failing.
#[test]
fn crd_file_is_up_to_date() {
    let generated = [
        (CRD_PATH, crd_yaml(), crd()),
        (
            lockwarden::api::ADMISSION_CONFIG_CRD_PATH,
            lockwarden::api::admission_config_crd_yaml(),
            lockwarden::api::admission_config_crd(),
        ),
    ];
    for (file, yaml, crd) in generated {
        let path = support::repo_root().join(file);
        let parsed: CustomResourceDefinition =
            serde_yaml_ng::from_str(&yaml).expect("a generated CRD in YAML");
        assert_eq!(
            parsed, crd,
            "{file}: the YAML does not read back as the CRD"
        );
        if std::env::var_os("LOCKWARDEN_UPDATE_CRDS").is_some_and(|v| v == "1") {
            let file_name = path.file_name().expect("a CRD path names a file");
            let chart_copy = support::repo_root().join(CHART_CRD_DIR).join(file_name);
            for target in [&path, &chart_copy] {
                std::fs::write(target, &yaml)
                    .unwrap_or_else(|e| panic!("cannot write {}: {e}", target.display()));
                eprintln!("rewrote {}", target.display());
            }
            continue;
        }
        let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            on_disk == yaml,
            "{file} is out of date with crates/api (or missing). Regenerate it (and the \
             chart's copy in {CHART_CRD_DIR}/) with \
             `LOCKWARDEN_UPDATE_CRDS=1 cargo test --test crd crd_file_is_up_to_date`"
        );
    }
}

/// The digest of each revision's generated schema (`spec`), newest last. A change of
/// the schema without a new [`lockwarden::api::CRD_REVISION`] would let a controller
/// take an older installed CRD for its own; this table makes that change fail here.
const REVISION_DIGESTS: &[(u32, &str)] = &[
    (2, "876a0b52c75ff2ea"),
    (3, "1987db5ae7c6c539"),
    (4, "eea41e3033a5b832"),
    (5, "f9b2932e907d13ca"),
    (6, "002c8afce5b85c53"),
    (7, "f42dcdd94c08c6da"),
    (8, "3d1766923fcc4f91"),
];

/// FNV-1a, 64 bits: stable across Rust releases (std's hashers promise no such thing).
fn fnv1a(bytes: &[u8]) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{hash:016x}")
}

#[test]
fn the_crd_revision_changes_with_the_schema() {
    let crd = crd();
    let spec = serde_json::to_vec(&serde_json::to_value(&crd.spec).unwrap()).unwrap();
    let digest = fnv1a(&spec);
    let revision = lockwarden::api::CRD_REVISION;
    assert_eq!(
        crd.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(lockwarden::api::CRD_REVISION_ANNOTATION)),
        Some(&revision.to_string()),
        "the generated CRD carries its revision"
    );
    let (newest, recorded) = *REVISION_DIGESTS.last().unwrap();
    assert!(
        newest == revision && recorded == digest,
        "the generated CRD schema (digest {digest}) is not the one recorded for revision \
         {revision} (revision {newest}: {recorded}). If the schema changed, bump \
         lockwarden::api::CRD_REVISION and add ({}, \"{digest}\") to REVISION_DIGESTS",
        revision + 1
    );
}

#[test]
fn crd_has_names_columns_and_list_map_conditions() {
    let crd = crd();
    assert_eq!(crd.metadata.name.as_deref(), Some(CRD_NAME));
    assert_eq!(DistributedLock::crd_name(), CRD_NAME);
    let names = &crd.spec.names;
    assert_eq!(names.kind, "DistributedLock");
    assert_eq!(
        names.short_names.as_deref(),
        Some(&["dlock".to_string()][..])
    );
    assert_eq!(
        names.categories.as_deref(),
        Some(&["lockwarden".to_string()][..])
    );
    assert_eq!(crd.spec.scope, "Namespaced");
    let version = &crd.spec.versions[0];
    assert_eq!(version.name, "v1alpha1");
    assert!(version.subresources.as_ref().unwrap().status.is_some());
    let columns: Vec<&str> = version
        .additional_printer_columns
        .as_ref()
        .unwrap()
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(
        columns,
        [
            "Backend", "Key", "Phase", "Holder", "Fence", "Permits", "In Use", "Position",
            "Expected", "Age"
        ]
    );
    let schema = serde_json::to_value(&version.schema).unwrap();
    let conditions = &schema["openAPIV3Schema"]["properties"]["status"]["properties"]["conditions"];
    assert_eq!(conditions["x-kubernetes-list-type"], json!("map"));
    assert_eq!(conditions["x-kubernetes-list-map-keys"], json!(["type"]));
    // Optional spec fields are not nullable: an explicit null is pruned, then defaulted.
    let text = serde_json::to_string(&schema["openAPIV3Schema"]["properties"]["spec"]).unwrap();
    assert!(!text.contains("nullable"), "nullable in spec schema");
}

/// The formats the API server knows (apiextensions-apiserver's supported formats, the
/// OpenAPI numeric ones included). Any other one makes every `kubectl apply -f crds/`
/// print `Warning: unrecognized format "…"`.
const KUBERNETES_FORMATS: &[&str] = &[
    "int32",
    "int64",
    "float",
    "double",
    "byte",
    "binary",
    "date",
    "date-time",
    "datetime",
    "duration",
    "password",
    "uri",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "cidr",
    "mac",
    "uuid",
    "uuid3",
    "uuid4",
    "uuid5",
    "bsonobjectid",
    "isbn",
    "isbn10",
    "isbn13",
    "creditcard",
    "ssn",
    "hexcolor",
    "rgbcolor",
];

/// Every `format` of a schema and its subschemas, with its JSON pointer. A property
/// *named* `format` is an object, not a string, and so not taken for one.
fn formats(schema: &Value, at: &str, found: &mut Vec<(String, String)>) {
    match schema {
        Value::Object(obj) => {
            for (k, v) in obj {
                match (k.as_str(), v) {
                    ("format", Value::String(f)) => found.push((at.to_string(), f.clone())),
                    _ => formats(v, &format!("{at}/{k}"), found),
                }
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                formats(v, &format!("{at}/{i}"), found);
            }
        }
        _ => {}
    }
}

/// No `format` outside the set Kubernetes knows, in the generated CRD and in the file
/// on disk (unsigned Rust integers are `int32`/`int64`, still with `minimum`).
#[test]
fn crd_schema_uses_only_formats_kubernetes_knows() {
    let on_disk: CustomResourceDefinition = serde_yaml_ng::from_str(
        &std::fs::read_to_string(support::repo_root().join(CRD_PATH)).expect("CRD file"),
    )
    .expect("the CRD file is a CRD");
    for (what, crd) in [("crd()", crd()), (CRD_PATH, on_disk)] {
        let schema = serde_json::to_value(&crd.spec.versions[0].schema).unwrap();
        let mut found = Vec::new();
        formats(&schema, "", &mut found);
        assert!(
            found.iter().any(|(_, f)| f == "int32"),
            "{what}: no int32 at all: {found:?}"
        );
        let unknown: Vec<_> = found
            .iter()
            .filter(|(_, f)| !KUBERNETES_FORMATS.contains(&f.as_str()))
            .collect();
        assert!(
            unknown.is_empty(),
            "{what}: formats Kubernetes does not know: {unknown:?}"
        );
    }
    let permits = &serde_json::to_value(&crd().spec.versions[0].schema).unwrap()["openAPIV3Schema"]
        ["properties"]["spec"]["properties"]["permits"];
    assert_eq!(permits["format"], json!("int32"), "{permits}");
    assert_eq!(permits["minimum"], json!(1.0), "{permits}");
    let holders = &serde_json::to_value(&crd().spec.versions[0].schema).unwrap()["openAPIV3Schema"]
        ["properties"]["status"]["properties"]["holders"];
    assert_eq!(holders["format"], json!("int64"), "{holders}");
    assert_eq!(holders["minimum"], json!(0.0), "{holders}");
}
