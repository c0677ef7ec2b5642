// Validates Prometheus Operator ServiceMonitors (monitoring.coreos.com/v1) with the schema of
// @kubernetes-models/prometheus-operator (generated from the operator's Go types; pinned in
// scripts/deploy-tools-node/, installed by scripts/install-deploy-tools.sh).
//
//   node scripts/check-servicemonitor.mjs < docs.json
//
// stdin: a JSON array of ServiceMonitor documents (scripts/check-k8s-manifests.py parses the
// YAML and sends them). Prints one line per problem and exits 1 if there is any.
//
// The package's validate() checks types, patterns and required fields but accepts any unknown
// field (its schemas set no additionalProperties), so a typo such as `endpoint:` or `prot:`
// would pass. The keys the package declares for the resource, its spec and each endpoint
// (read from its own type declarations, so they follow the pinned version) are checked here
// on top.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { homedir } from "node:os";
import { pathToFileURL } from "node:url";

const toolsDir = process.env.PAGODA_NODE_TOOLS_DIR || join(homedir(), ".cache", "pagoda-node-tools");
const v1 = join(toolsDir, "node_modules", "@kubernetes-models", "prometheus-operator", "monitoring.coreos.com", "v1");

// The package's exports map serves ESM only; importing the file by path works from anywhere.
const { ServiceMonitor } = await import(pathToFileURL(join(v1, "ServiceMonitor.js")).href);

// The property names of `export declare class NAME` in v1/NAME.d.ts: the lines indented by
// exactly four spaces inside the class body (nested object types are indented deeper).
function declaredKeys(name) {
    const text = readFileSync(join(v1, `${name}.d.ts`), "utf8");
    const start = text.indexOf(`export declare class ${name} `);
    if (start < 0) throw new Error(`${name}.d.ts declares no class ${name}`);
    const body = text.slice(start, text.indexOf("\n}", start));
    const keys = new Set([...body.matchAll(/^ {4}"([A-Za-z0-9_]+)"\??:/gm)].map((m) => m[1]));
    if (keys.size === 0) throw new Error(`found no properties of ${name} in ${name}.d.ts`);
    return keys;
}

const known = {
    resource: declaredKeys("ServiceMonitor"),
    spec: declaredKeys("ServiceMonitorSpec"),
    endpoint: declaredKeys("Endpoint"),
};

function unknownKeys(object, allowed, where) {
    if (object === null || typeof object !== "object" || Array.isArray(object)) return [];
    return Object.keys(object)
        .filter((key) => !allowed.has(key))
        .map((key) => `${where}: unknown field "${key}"`);
}

const docs = JSON.parse(readFileSync(0, "utf8"));
const problems = [];
for (const doc of docs) {
    const name = `ServiceMonitor ${doc?.metadata?.name ?? "(no name)"}`;
    try {
        new ServiceMonitor(doc).validate();
    } catch (error) {
        problems.push(`${name}: ${error.message}`);
    }
    problems.push(...unknownKeys(doc, known.resource, name));
    problems.push(...unknownKeys(doc?.spec, known.spec, `${name} spec`));
    (Array.isArray(doc?.spec?.endpoints) ? doc.spec.endpoints : []).forEach((endpoint, i) => {
        problems.push(...unknownKeys(endpoint, known.endpoint, `${name} spec.endpoints[${i}]`));
    });
}
for (const problem of problems) console.error(problem);
process.exit(problems.length > 0 ? 1 : 0);
