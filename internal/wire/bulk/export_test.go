package bulk

// RequestFrame is frameOf for the external tests: a request frame as a
// client sends it.
var RequestFrame = frameOf
