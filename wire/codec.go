package wire

import (
	"errors"
	"math"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// A hand-written codec for the lease exchange (acquire, session, ping;
// queued, grant, ignore, hide, error, pong, ok), a task's submission
// (submit; submitted) and Slurm's Prolog and Epilog (slurm-prolog,
// slurm-epilog; ok): npurun runs it once per job, task-submit once per
// task, npurun-slurm twice per Slurm job, and encoding/json's first use, which builds its reflection caches,
// costs more than the whole round trip to the broker (1 to 2 ms each way
// here); npurun does not even link encoding/json. Everything else goes
// through the registered Codec (encoding/json); codec_test.go checks the
// two agree.

// appendRequest encodes an acquire, session, ping or submit request; ok is
// false for any other request, which the caller encodes with the Codec.
func appendRequest(b []byte, r *Request) ([]byte, bool) {
	if r.Status != nil || r.ID != 0 || r.All || r.After != 0 || r.Ended || r.Since != 0 || r.Watch || r.Usage != nil || r.History != nil || r.Container != nil || r.Device != "" || r.Reason != "" || r.Check != "" {
		return nil, false
	}
	if r.Job != nil || IsSlurmOp(r.Op) {
		if !IsSlurmOp(r.Op) || r.Job == nil || r.Task != nil || r.N != 0 || r.Pool != "" || r.Devices != nil || r.NoWait || r.Mem != 0 || r.TimeSec != 0 ||
			r.User != "" || r.Service != "" || r.TTY != "" || r.RHost != "" || r.Login {
			return nil, false
		}
		return appendSlurm(b, r), true
	}
	switch {
	case r.Op == OpSubmit && r.Task != nil && r.N == 0 && r.Pool == "" && r.Devices == nil && !r.NoWait && r.Mem == 0 && r.TimeSec == 0 &&
		r.User == "" && r.Service == "" && r.TTY == "" && r.RHost == "" && !r.Login:
		return appendSubmit(b, r), true
	case (r.Op != OpAcquire && r.Op != OpPing && r.Op != OpSession) || r.Task != nil:
		return nil, false
	}
	b = append(b, `{"v":`...)
	b = strconv.AppendInt(b, int64(r.V), 10)
	b = append(b, `,"op":`...)
	b = appendJSONString(b, r.Op)
	if r.N != 0 {
		b = append(b, `,"n":`...)
		b = strconv.AppendInt(b, int64(r.N), 10)
	}
	if r.Pool != "" {
		b = append(b, `,"pool":`...)
		b = appendJSONString(b, r.Pool)
	}
	if len(r.Devices) > 0 {
		b = append(b, `,"devices":`...)
		b = appendNumbers(b, r.Devices)
	}
	if r.NoWait {
		b = append(b, `,"no_wait":true`...)
	}
	if r.Mem != 0 {
		b = append(b, `,"mem":`...)
		b = strconv.AppendInt(b, r.Mem, 10)
	}
	if r.TimeSec != 0 {
		b = append(b, `,"time_sec":`...)
		b = strconv.AppendInt(b, r.TimeSec, 10)
	}
	for _, f := range [...]struct{ key, value string }{{"user", r.User}, {"service", r.Service}, {"tty", r.TTY}, {"rhost", r.RHost}} {
		if f.value != "" {
			b = append(b, `,"`+f.key+`":`...)
			b = appendJSONString(b, f.value)
		}
	}
	if r.Login {
		b = append(b, `,"login":true`...)
	}
	return append(b, '}'), true
}

// appendSlurm encodes a Slurm operation, as encoding/json would: the
// job's fields in order, "uid" always, the others left out when empty.
func appendSlurm(b []byte, r *Request) []byte {
	j := r.Job
	b = append(b, `{"v":`...)
	b = strconv.AppendInt(b, int64(r.V), 10)
	b = append(b, `,"op":`...)
	b = appendJSONString(b, r.Op)
	b = append(b, `,"job":{"id":`...)
	b = strconv.AppendUint(b, uint64(j.ID), 10)
	b = append(b, `,"uid":`...)
	b = strconv.AppendUint(b, uint64(j.UID), 10)
	if j.User != "" {
		b = append(b, `,"user":`...)
		b = appendJSONString(b, j.User)
	}
	if j.GRES != "" {
		b = append(b, `,"gres":`...)
		b = appendJSONString(b, j.GRES)
	}
	if j.Step != 0 {
		b = append(b, `,"step":`...)
		b = strconv.AppendUint(b, uint64(j.Step), 10)
	}
	return append(b, "}}"...)
}

// appendSubmit encodes a submit request, as encoding/json would (but for
// its HTML escapes): the fields in order, those marked omitempty left out
// when empty, a nil list as null.
func appendSubmit(b []byte, r *Request) []byte {
	t := r.Task
	b = append(b, `{"v":`...)
	b = strconv.AppendInt(b, int64(r.V), 10)
	b = append(b, `,"op":`...)
	b = appendJSONString(b, r.Op)
	b = append(b, `,"task":{`...)
	comma := false
	key := func(k string) {
		if comma {
			b = append(b, ',')
		}
		comma = true
		b = append(b, '"')
		b = append(b, k...)
		b = append(b, `":`...)
	}
	strs := func(list []string) {
		if list == nil {
			b = append(b, "null"...)
			return
		}
		b = append(b, '[')
		for i, s := range list {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, s)
		}
		b = append(b, ']')
	}
	if len(t.Argv) > 0 {
		key("argv")
		strs(t.Argv)
	}
	if t.Shell != "" {
		key("shell")
		b = appendJSONString(b, t.Shell)
	}
	key("cwd")
	b = appendJSONString(b, t.Cwd)
	key("env")
	strs(t.Env)
	if t.N != 0 {
		key("n")
		b = strconv.AppendInt(b, int64(t.N), 10)
	}
	if len(t.Devices) > 0 {
		key("devices")
		b = appendNumbers(b, t.Devices)
	}
	if t.Pool != "" {
		key("pool")
		b = appendJSONString(b, t.Pool)
	}
	if t.Mem != 0 {
		key("mem")
		b = strconv.AppendInt(b, t.Mem, 10)
	}
	if t.OOMRetries != 0 {
		key("oom_retries")
		b = strconv.AppendInt(b, int64(t.OOMRetries), 10)
	}
	if t.RetryOf != 0 {
		key("retry_of")
		b = strconv.AppendUint(b, t.RetryOf, 10)
	}
	if t.NoDevice {
		key("no_device")
		b = append(b, "true"...)
	}
	if t.TimeSec != 0 {
		key("time_sec")
		b = strconv.AppendInt(b, t.TimeSec, 10)
	}
	if t.Name != "" {
		key("name")
		b = appendJSONString(b, t.Name)
	}
	if len(t.After) > 0 {
		key("after")
		b = appendNumbers(b, t.After)
	}
	if t.Log != "" {
		key("log")
		b = appendJSONString(b, t.Log)
	}
	if t.Umask != nil {
		key("umask")
		b = strconv.AppendUint(b, uint64(*t.Umask), 10)
	}
	if t.Token != "" {
		key("token")
		b = appendJSONString(b, t.Token)
	}
	if t.Notify != "" {
		key("notify")
		b = appendJSONString(b, t.Notify)
	}
	if t.NoNotify {
		key("no_notify")
		b = append(b, "true"...)
	}
	return append(b, "}}"...)
}

var errSyntax = errors.New("malformed reply")

// decodeReply decodes a lease-exchange reply, a submitted one or a tasks
// one (codec_tasks.go); ok is false for other reply types (the caller then uses encoding/json), err
// for malformed input.
func decodeReply(data []byte) (r *Reply, ok bool, err error) {
	s := &scanner{b: data}
	r = &Reply{}
	unsure := false
	err = s.object(func(key string) error {
		var err error
		switch key {
		case "v":
			var n int64
			n, err = s.int()
			r.V = int(n)
		case "type":
			r.Type, err = s.string()
		case "pool":
			r.Pool, err = s.string()
		case "position":
			var n int64
			n, err = s.int()
			r.Position = int(n)
		case "ahead":
			r.Ahead, err = s.strings()
		case "reason":
			r.Reason, err = s.string()
		case "start":
			r.Start, err = s.int()
		case "devices":
			r.Devices, err = s.ints()
		case "vendor":
			r.Vendor, err = s.string()
		case "env":
			r.Env, err = s.strings()
		case "waited_ms":
			r.WaitedMS, err = s.int()
		case "wait_ms":
			r.WaitMS, err = s.int()
		case "slurm_job":
			var n uint64
			n, err = s.uint()
			if err == nil && n > math.MaxUint32 {
				err = errSyntax
			}
			r.SlurmJob = uint32(n)
		case "ends_by":
			r.EndsBy, err = s.int()
		case "before":
			r.Before, err = s.string()
		case "beside":
			r.Beside, err = s.bool()
		case "code":
			r.Code, err = s.string()
		case "message":
			r.Message, err = s.string()
		case "hint":
			r.Hint, err = s.string()
		case "id":
			r.ID, err = s.uint()
		case "state":
			r.State, err = s.string()
		case "existing":
			r.Existing, err = s.bool()
		case "tasks":
			var u bool
			r.Tasks, u, err = s.tasks()
			unsure = unsure || u
		case "more":
			r.More, err = s.bool()
		case "next":
			r.Next, err = s.uint()
		default:
			// encoding/json matches keys case-insensitively (with Unicode
			// folding): leave anything that might match to it.
			unsure = unsure || mightFold(key)
			err = s.skip()
		}
		return err
	})
	if err != nil {
		return nil, false, err
	}
	if unsure {
		return nil, false, nil
	}
	if s.ws(); s.i != len(s.b) {
		return nil, false, errSyntax
	}
	switch r.Type {
	case TypeQueued, TypeGrant, TypeError, TypePong, TypeOK, TypeIgnore, TypeHide, TypeSubmitted, TypeTasks, TypeEnded:
		return r, true, nil
	}
	return nil, false, nil
}

var replyKeys = []string{"v", "type", "pool", "position", "ahead", "reason", "start", "devices", "vendor", "env", "waited_ms", "slurm_job", "ends_by", "before", "beside", "wait_ms", "code", "message", "hint", "id", "state", "tasks", "more", "next", "existing", "board", "usage", "lease_history", "drain", "reload"}

// mightFold tells whether encoding/json could take key for one of Reply's.
func mightFold(key string) bool { return mightFoldInto(key, replyKeys) }

// scanner reads the JSON the broker writes. It accepts standard JSON.
type scanner struct {
	b    []byte
	i    int
	seen map[string]string // strings read by shared
}

func (s *scanner) ws() {
	for s.i < len(s.b) && (s.b[s.i] == ' ' || s.b[s.i] == '\t' || s.b[s.i] == '\n' || s.b[s.i] == '\r') {
		s.i++
	}
}

func (s *scanner) peek() byte {
	s.ws()
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

func (s *scanner) expect(c byte) error {
	if s.peek() != c {
		return errSyntax
	}
	s.i++
	return nil
}

func (s *scanner) literal(word string) error {
	s.ws()
	if len(s.b)-s.i < len(word) || string(s.b[s.i:s.i+len(word)]) != word {
		return errSyntax
	}
	s.i += len(word)
	return nil
}

func (s *scanner) object(field func(key string) error) error {
	if err := s.expect('{'); err != nil {
		return err
	}
	if s.peek() == '}' {
		s.i++
		return nil
	}
	for {
		key, err := s.string()
		if err != nil {
			return err
		}
		if err := s.expect(':'); err != nil {
			return err
		}
		if err := field(key); err != nil {
			return err
		}
		switch s.peek() {
		case ',':
			s.i++
		case '}':
			s.i++
			return nil
		default:
			return errSyntax
		}
	}
}

func (s *scanner) array(elem func() error) error {
	if err := s.expect('['); err != nil {
		return err
	}
	if s.peek() == ']' {
		s.i++
		return nil
	}
	for {
		if err := elem(); err != nil {
			return err
		}
		switch s.peek() {
		case ',':
			s.i++
		case ']':
			s.i++
			return nil
		default:
			return errSyntax
		}
	}
}

func (s *scanner) string() (string, error) {
	if err := s.expect('"'); err != nil {
		return "", err
	}
	start := s.i
	for s.i < len(s.b) {
		switch c := s.b[s.i]; {
		case c == '"':
			v := string(s.b[start:s.i])
			s.i++
			return v, nil
		case c == '\\' || c >= utf8.RuneSelf:
			return s.escaped(start)
		case c < 0x20:
			return "", errSyntax
		}
		s.i++
	}
	return "", errSyntax
}

// escaped finishes a string that has escapes, from its first one.
func (s *scanner) escaped(start int) (string, error) {
	out := append([]byte(nil), s.b[start:s.i]...)
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			s.i++
			return string(out), nil
		case c < 0x20:
			return "", errSyntax
		case c >= utf8.RuneSelf:
			r, size := utf8.DecodeRune(s.b[s.i:])
			out = utf8.AppendRune(out, r) // invalid UTF-8 becomes U+FFFD, as in encoding/json
			s.i += size
			continue
		case c != '\\':
			out = append(out, c)
			s.i++
			continue
		}
		if s.i+1 >= len(s.b) {
			return "", errSyntax
		}
		e := s.b[s.i+1]
		s.i += 2
		switch e {
		case '"', '\\', '/':
			out = append(out, e)
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r, ok := s.hex4()
			if !ok {
				return "", errSyntax
			}
			if utf16.IsSurrogate(r) {
				r2 := utf8.RuneError
				if s.i+1 < len(s.b) && s.b[s.i] == '\\' && s.b[s.i+1] == 'u' {
					save := s.i
					s.i += 2
					if lo, ok := s.hex4(); ok {
						if d := utf16.DecodeRune(r, lo); d != utf8.RuneError {
							r2 = d
						} else {
							s.i = save
						}
					} else {
						return "", errSyntax
					}
				}
				r = r2
			}
			out = utf8.AppendRune(out, r)
		default:
			return "", errSyntax
		}
	}
	return "", errSyntax
}

func (s *scanner) hex4() (rune, bool) {
	if s.i+4 > len(s.b) {
		return 0, false
	}
	n, err := strconv.ParseUint(string(s.b[s.i:s.i+4]), 16, 32)
	if err != nil {
		return 0, false
	}
	s.i += 4
	return rune(n), true
}

// number reads a JSON number (-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?)
// and tells whether it is an integer.
func (s *scanner) number() (string, bool, error) {
	s.ws()
	start := s.i
	digits := func() int {
		n := 0
		for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
			s.i++
			n++
		}
		return n
	}
	if s.i < len(s.b) && s.b[s.i] == '-' {
		s.i++
	}
	switch {
	case s.i < len(s.b) && s.b[s.i] == '0':
		s.i++
	case digits() == 0:
		return "", false, errSyntax
	}
	integer := true
	if s.i < len(s.b) && s.b[s.i] == '.' {
		s.i++
		if digits() == 0 {
			return "", false, errSyntax
		}
		integer = false
	}
	if s.i < len(s.b) && (s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		s.i++
		if s.i < len(s.b) && (s.b[s.i] == '+' || s.b[s.i] == '-') {
			s.i++
		}
		if digits() == 0 {
			return "", false, errSyntax
		}
		integer = false
	}
	return string(s.b[start:s.i]), integer, nil
}

// int reads an integer; a fraction or an exponent is malformed here, as
// encoding/json refuses them for an integer field.
func (s *scanner) int() (int64, error) {
	text, integer, err := s.number()
	if err != nil || !integer {
		return 0, errSyntax
	}
	n, err := strconv.ParseInt(text, 10, 64)
	if err != nil {
		return 0, errSyntax
	}
	return n, nil
}

// uint reads an unsigned integer, as encoding/json does for a uint64.
func (s *scanner) uint() (uint64, error) {
	text, integer, err := s.number()
	if err != nil || !integer {
		return 0, errSyntax
	}
	n, err := strconv.ParseUint(text, 10, 64)
	if err != nil {
		return 0, errSyntax
	}
	return n, nil
}

// arrayOf reads an array of what one reads, or null (nil).
func arrayOf[T any](s *scanner, one func() (T, error)) ([]T, error) {
	if s.peek() == 'n' {
		return nil, s.literal("null")
	}
	out := []T{}
	err := s.array(func() error {
		v, err := one()
		out = append(out, v)
		return err
	})
	return out, err
}

func (s *scanner) strings() ([]string, error) { return arrayOf(s, s.string) }

func (s *scanner) ints() ([]int, error) {
	return arrayOf(s, func() (int, error) {
		v, err := s.int()
		return int(v), err
	})
}

// skip reads past any value.
func (s *scanner) skip() error {
	switch c := s.peek(); {
	case c == '"':
		_, err := s.string()
		return err
	case c == '{':
		return s.object(func(string) error { return s.skip() })
	case c == '[':
		return s.array(s.skip)
	case c == 't':
		return s.literal("true")
	case c == 'f':
		return s.literal("false")
	case c == 'n':
		return s.literal("null")
	case c == '-' || (c >= '0' && c <= '9'):
		_, _, err := s.number()
		return err
	}
	return errSyntax
}

// appendNumbers appends xs as a JSON array.
func appendNumbers[T int | uint64](b []byte, xs []T) []byte {
	b = append(b, '[')
	for i, x := range xs {
		if i > 0 {
			b = append(b, ',')
		}
		if x < 0 {
			b = strconv.AppendInt(b, int64(x), 10)
		} else {
			b = strconv.AppendUint(b, uint64(x), 10)
		}
	}
	return append(b, ']')
}

// The broker's side of the lease exchange: it reads acquire, session and
// ping requests and writes queued, grant, error, pong, ignore and hide
// replies without encoding/json, on the path from an npurun's connection
// to its grant, which npurun waits for at every start (issue 9). Timed in
// the broker there, one request after another's lease (caches cold),
// encoding/json took 17 µs to decode an acquire and 5 µs to encode its
// grant on a 2-vCPU VM; in a loop 1.4 and 0.7 µs against these
// functions' 0.3 and 0.2 (BenchmarkDecodeRequest, BenchmarkAppendReply).

// DecodeRequest decodes an acquire, session or ping request as
// encoding/json would. It declines (false) anything else, and anything it
// is not sure encoding/json reads the same way (an unknown or oddly cased
// key, a null, malformed input), which the caller then decodes with
// encoding/json, errors and all.
func DecodeRequest(data []byte) (*Request, bool) {
	s := &scanner{b: data}
	r := &Request{}
	err := s.object(func(key string) error {
		var err error
		var n int64
		switch key {
		case "v":
			n, err = s.int()
			r.V = int(n)
		case "op":
			r.Op, err = s.string()
		case "n":
			n, err = s.int()
			r.N = int(n)
		case "pool":
			r.Pool, err = s.string()
		case "devices":
			if s.peek() == 'n' {
				return errSyntax // null: leave it to encoding/json
			}
			r.Devices, err = s.ints()
		case "no_wait":
			r.NoWait, err = s.bool()
		case "mem":
			r.Mem, err = s.int()
		case "time_sec":
			r.TimeSec, err = s.int()
		case "user":
			r.User, err = s.string()
		case "service":
			r.Service, err = s.string()
		case "tty":
			r.TTY, err = s.string()
		case "rhost":
			r.RHost, err = s.string()
		case "login":
			r.Login, err = s.bool()
		default:
			err = errSyntax
		}
		return err
	})
	if err != nil || s.peek() != 0 || s.i != len(s.b) {
		return nil, false
	}
	switch r.Op {
	case OpAcquire, OpSession, OpPing:
		return r, true
	}
	return nil, false
}

func (s *scanner) bool() (bool, error) {
	switch s.peek() {
	case 't':
		return true, s.literal("true")
	case 'f':
		return false, s.literal("false")
	}
	return false, errSyntax
}

// AppendReply encodes a reply of the lease exchange byte for byte as
// encoding/json does; false for a reply with fields beyond it (tasks,
// status, usage), which the caller encodes with the Codec.
func AppendReply(b []byte, r *Reply) ([]byte, bool) {
	if r.ID != 0 || r.State != "" || len(r.Tasks) > 0 || r.More || r.Next != 0 || r.Existing || r.Board != nil || r.Usage != nil || r.History != nil || r.Drain != nil || r.Reload != nil {
		return nil, false
	}
	b = append(b, `{"v":`...)
	b = strconv.AppendInt(b, int64(r.V), 10)
	b = append(b, `,"type":`...)
	b = appendJSONString(b, r.Type)
	b = appendField(b, `,"pool":`, r.Pool)
	b = appendInt(b, `,"position":`, int64(r.Position))
	b = appendStrings(b, `,"ahead":`, r.Ahead)
	b = appendField(b, `,"reason":`, r.Reason)
	b = appendInt(b, `,"start":`, r.Start)
	b = appendInt(b, `,"wait_ms":`, r.WaitMS)
	if len(r.Devices) > 0 {
		b = append(b, `,"devices":`...)
		b = appendNumbers(b, r.Devices)
	}
	b = appendField(b, `,"vendor":`, r.Vendor)
	b = appendStrings(b, `,"env":`, r.Env)
	b = appendInt(b, `,"waited_ms":`, r.WaitedMS)
	b = appendInt(b, `,"slurm_job":`, int64(r.SlurmJob))
	b = appendInt(b, `,"ends_by":`, r.EndsBy)
	b = appendField(b, `,"before":`, r.Before)
	if r.Beside {
		b = append(b, `,"beside":true`...)
	}
	b = appendField(b, `,"code":`, r.Code)
	b = appendField(b, `,"message":`, r.Message)
	b = appendField(b, `,"hint":`, r.Hint)
	return append(b, '}'), true
}

// appendField, appendInt and appendStrings append key and v unless v is
// empty (omitempty).
func appendField(b []byte, key, v string) []byte {
	if v == "" {
		return b
	}
	return appendJSONString(append(b, key...), v)
}

func appendInt(b []byte, key string, v int64) []byte {
	if v == 0 {
		return b
	}
	return strconv.AppendInt(append(b, key...), v, 10)
}

func appendStrings(b []byte, key string, vs []string) []byte {
	if len(vs) == 0 {
		return b
	}
	b = append(append(b, key...), '[')
	for i, v := range vs {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, v)
	}
	return append(b, ']')
}

// jsonPlain marks the bytes appendJSONString writes as they are;
// jsonPlainNoHTML, those that encoding/json writes as they are without
// its HTML escapes (Encoder.SetEscapeHTML(false)): <, > and & too.
var jsonPlain, jsonPlainNoHTML = func() (t, u [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		u[c] = c != '"' && c != '\\'
		t[c] = u[c] && c != '<' && c != '>' && c != '&'
	}
	return t, u
}()

// appendJSONString appends s as encoding/json writes a string: invalid
// UTF-8 as U+FFFD, and <, >, &, U+2028 and U+2029 escaped.
func appendJSONString(b []byte, s string) []byte { return appendJSONStringPlain(b, s, &jsonPlain) }

// appendJSONStringPlain is appendJSONString writing the bytes plain marks
// as they are (jsonPlain, or jsonPlainNoHTML).
func appendJSONStringPlain(b []byte, s string, plain *[256]bool) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		// A run of bytes written as they are goes in at once.
		j := i
		for j < len(s) && plain[s[j]] {
			j++
		}
		if j > i {
			b = append(b, s[i:j]...)
			if i = j; i == len(s) {
				break
			}
		}
		c := s[i]
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRuneInString(s[i:])
			switch {
			case r == utf8.RuneError && size == 1:
				b = append(b, `\ufffd`...)
			case r == '\u2028' || r == '\u2029':
				b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xf])
			default:
				b = append(b, s[i:i+size]...)
			}
			i += size
			continue
		}
		switch c {
		case '"', '\\':
			b = append(b, '\\', c)
		case '\b':
			b = append(b, '\\', 'b')
		case '\f':
			b = append(b, '\\', 'f')
		case '\n':
			b = append(b, '\\', 'n')
		case '\r':
			b = append(b, '\\', 'r')
		case '\t':
			b = append(b, '\\', 't')
		default:
			if c < 0x20 || c == '<' || c == '>' || c == '&' {
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			} else {
				b = append(b, c)
			}
		}
		i++
	}
	return append(b, '"')
}
