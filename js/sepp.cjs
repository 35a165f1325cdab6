// CommonJS entry of the `sepp` package: the ES module itself (require(esm), Node 20.19 and
// later), so `require("sepp")` and `import "sepp"` share one set of classes and
// `instanceof` works across both.
module.exports = require("./sepp.js");
