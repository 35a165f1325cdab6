// Preloaded (`node --require`) by test/tracing.test.js's child: makes `@opentelemetry/api`
// unresolvable, as in an install without the optional peer dependency.
const Module = require("node:module");
const resolve = Module._resolveFilename;
Module._resolveFilename = function (request, ...rest) {
  if (request === "@opentelemetry/api" || request.startsWith("@opentelemetry/api/")) {
    const err = new Error(`Cannot find module '${request}'`);
    Object.assign(err, { code: "MODULE_NOT_FOUND" });
    throw err;
  }
  return resolve.call(this, request, ...rest);
};
