package wire

import "encoding/json"

// The tests of this package use encoding/json as the Codec, as package
// jsoncodec registers it (which they cannot import: it imports this one).
func init() { UseCodec(testCodec{}) }

type testCodec struct{}

func (testCodec) Marshal(v any) ([]byte, error)      { return json.Marshal(v) }
func (testCodec) Unmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }
