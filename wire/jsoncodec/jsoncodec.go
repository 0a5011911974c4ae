// Package jsoncodec lets the wire's client speak every message with
// encoding/json, not only the lease exchange. npurun must never import it
// (its start path stays free of encoding/json).
package jsoncodec

// A program imports this package for its effect: wire.Encode and
// wire.Conn.Recv use encoding/json for the messages that the lease
// exchange's own codec does not cover (tasks, status, usage). npurun does
// not import it, and so does not link encoding/json at all.

import (
	"encoding/json"

	"github.com/npurun/npurun/wire"
)

func init() { wire.UseCodec(codec{}) }

type codec struct{}

func (codec) Marshal(v any) ([]byte, error)      { return json.Marshal(v) }
func (codec) Unmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }
