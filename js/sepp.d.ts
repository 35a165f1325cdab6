// Types of the `sepp` package: the declarations generated from the Rust doc comments
// (index.d.ts: SeppClient, Engine, Lease, requests, results), the error classes (errors.d.ts)
// and the worker (worker.d.ts).
export * from "./index.js";
export * from "./errors.js";
export * from "./worker.js";
