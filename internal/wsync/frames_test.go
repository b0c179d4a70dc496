package wsync

import "github.com/rlhub/rlhub/internal/wsync/wsynctest"

// writeVersion answers a data-plane request with snap (whole or cut off).
var writeVersion = wsynctest.WriteVersion
