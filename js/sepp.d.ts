// Types of the `sepp` package: the declarations generated from the Rust doc comments
// (index.d.ts: SeppClient, requests, results) and the error classes (errors.d.ts).
export * from "./index.js";
export * from "./errors.js";
