package wire

import (
	"bytes"
	"reflect"
	"strconv"
	"strings"
	"unicode/utf8"
)

// The hand codec of a listing's tasks (a "tasks" reply): the broker
// encodes each task of a page with AppendTaskInfo, and Conn decodes the
// page with decodeTasks, without encoding/json's reflection. A listing of
// 10,000 tasks is about 2 MiB of JSON in some 40 pages; through
// encoding/json its encoding took a fifth of the broker's time for it
// and its decoding over a third of task-submit list's (BenchmarkTaskList,
// issue of list at 10,000 tasks). Both agree with encoding/json byte for
// byte and value for value (codec_tasks_test.go).

// AppendTaskInfo appends t encoded byte for byte as encoding/json's
// Marshal encodes it: the fields in order, those marked omitempty left
// out when empty, strings HTML-escaped.
func AppendTaskInfo(b []byte, t *TaskInfo) []byte { return appendTaskInfo(b, t, &jsonPlain) }

// AppendTaskInfoNoHTML is AppendTaskInfo as an encoding/json Encoder
// without HTML escapes (SetEscapeHTML(false)) writes t: <, > and & as
// they are (task-submit list --json).
func AppendTaskInfoNoHTML(b []byte, t *TaskInfo) []byte {
	return appendTaskInfo(b, t, &jsonPlainNoHTML)
}

func appendTaskInfo(b []byte, t *TaskInfo, plain *[256]bool) []byte {
	str := func(b []byte, key, v string) []byte {
		if v == "" {
			return b
		}
		return appendJSONStringPlain(append(b, key...), v, plain)
	}
	b = append(b, `{"id":`...)
	b = strconv.AppendUint(b, t.ID, 10)
	b = appendJSONStringPlain(append(b, `,"user":`...), t.User, plain)
	b = append(b, `,"uid":`...)
	b = strconv.AppendUint(b, uint64(t.UID), 10)
	b = str(b, `,"name":`, t.Name)
	b = appendJSONStringPlain(append(b, `,"state":`...), t.State, plain)
	b = str(b, `,"command":`, t.Command)
	b = str(b, `,"cwd":`, t.Cwd)
	if len(t.Env) > 0 {
		b = append(b, `,"env":[`...)
		for i, v := range t.Env {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONStringPlain(b, v, plain)
		}
		b = append(b, ']')
	}
	b = str(b, `,"log":`, t.Log)
	b = appendInt(b, `,"n":`, int64(t.N))
	b = str(b, `,"pool":`, t.Pool)
	b = appendInt(b, `,"mem":`, t.Mem)
	b = appendInt(b, `,"oom_retries":`, int64(t.OOMRetries))
	b = appendUint(b, `,"retry_of":`, t.RetryOf)
	b = appendBool(b, `,"no_device":true`, t.NoDevice)
	if len(t.Devices) > 0 {
		b = appendNumbers(append(b, `,"devices":`...), t.Devices)
	}
	if len(t.After) > 0 {
		b = appendNumbers(append(b, `,"after":`...), t.After)
	}
	b = appendInt(b, `,"time_sec":`, t.TimeSec)
	b = appendInt(b, `,"position":`, int64(t.Position))
	if bf := t.Backfill; bf != nil {
		b = strconv.AppendInt(append(b, `,"backfill":{"ends_by":`...), bf.EndsBy, 10)
		b = appendJSONStringPlain(append(b, `,"before":`...), bf.Before, plain)
		b = appendInt(b, `,"before_start":`, bf.BeforeStart)
		b = appendBool(b, `,"beside":true`, bf.Beside)
		b = append(b, '}')
	}
	b = appendInt(b, `,"start":`, t.Start)
	b = append(b, `,"submitted":`...)
	b = strconv.AppendInt(b, t.Submitted, 10)
	b = appendInt(b, `,"started":`, t.Started)
	b = appendInt(b, `,"ended":`, t.Ended)
	b = appendBool(b, `,"never_ran":true`, t.NeverRan)
	if t.Exit != nil {
		b = strconv.AppendInt(append(b, `,"exit":`...), int64(*t.Exit), 10)
	}
	b = str(b, `,"signal":`, t.Signal)
	b = str(b, `,"reason":`, t.Reason)
	b = appendInt(b, `,"cpu_ms":`, t.CPUMs)
	b = appendInt(b, `,"mem_peak":`, t.MemPeak)
	b = appendInt(b, `,"device_peak":`, t.DevPeak)
	b = str(b, `,"token":`, t.Token)
	b = appendBool(b, `,"held":true`, t.Held)
	b = appendUint(b, `,"from":`, t.From)
	b = str(b, `,"source":`, t.Source)
	return append(b, '}')
}

func appendUint(b []byte, key string, v uint64) []byte {
	if v == 0 {
		return b
	}
	return strconv.AppendUint(append(b, key...), v, 10)
}

func appendBool(b []byte, keyTrue string, v bool) []byte {
	if !v {
		return b
	}
	return append(b, keyTrue...)
}

// taskKeys are TaskInfo's JSON keys.
var taskKeys = func() []string {
	var keys []string
	for f := range reflect.TypeFor[TaskInfo]().Fields() {
		key, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		keys = append(keys, key)
	}
	return keys
}()

// decodeTasks decodes a list of tasks as encoding/json would into a nil
// slice; unsure tells that it met what it is not sure encoding/json reads
// the same way (a null, an unknown key that might match one of
// TaskInfo's by case folding, an out-of-range uid), and the caller should
// decode the whole reply with encoding/json instead.
func (s *scanner) tasks() (ts []TaskInfo, unsure bool, err error) {
	if s.peek() == 'n' {
		return nil, false, s.literal("null")
	}
	// Room for as many tasks as there are "id" keys: a guess, never
	// wrong by more than the odd key of that name in a string.
	ts = make([]TaskInfo, 0, bytes.Count(s.b[s.i:], []byte(`{"id":`)))
	err = s.array(func() error {
		if s.peek() == 'n' {
			unsure = true
			return s.literal("null")
		}
		ts = append(ts, TaskInfo{})
		u, err := s.task(&ts[len(ts)-1])
		unsure = unsure || u
		return err
	})
	return ts, unsure, err
}

// task decodes one task into t; unsure as for tasks.
func (s *scanner) task(t *TaskInfo) (unsure bool, err error) {
	err = s.object(func(key string) error {
		if s.peek() == 'n' { // encoding/json leaves a field alone for null, or sets it nil
			unsure = true
			return s.literal("null")
		}
		var err error
		var n int64
		var u uint64
		switch key {
		case "id":
			t.ID, err = s.uint()
		case "user":
			t.User, err = s.shared()
		case "uid":
			u, err = s.uint()
			if u > 1<<32-1 {
				unsure = true // encoding/json reports it, after decoding the rest
			}
			t.UID = uint32(u)
		case "name":
			t.Name, err = s.shared()
		case "state":
			t.State, err = s.shared()
		case "command":
			t.Command, err = s.shared()
		case "cwd":
			t.Cwd, err = s.shared()
		case "env":
			t.Env, err = s.strings()
		case "log":
			t.Log, err = s.shared()
		case "n":
			n, err = s.int()
			t.N = int(n)
		case "pool":
			t.Pool, err = s.shared()
		case "mem":
			t.Mem, err = s.int()
		case "oom_retries":
			n, err = s.int()
			t.OOMRetries = int(n)
		case "retry_of":
			t.RetryOf, err = s.uint()
		case "no_device":
			t.NoDevice, err = s.bool()
		case "devices":
			t.Devices, err = s.ints()
		case "after":
			t.After, err = s.uints()
		case "time_sec":
			t.TimeSec, err = s.int()
		case "position":
			n, err = s.int()
			t.Position = int(n)
		case "start":
			t.Start, err = s.int()
		case "submitted":
			t.Submitted, err = s.int()
		case "started":
			t.Started, err = s.int()
		case "ended":
			t.Ended, err = s.int()
		case "never_ran":
			t.NeverRan, err = s.bool()
		case "exit":
			n, err = s.int()
			x := int(n)
			t.Exit = &x
		case "signal":
			t.Signal, err = s.shared()
		case "reason":
			t.Reason, err = s.string()
		case "cpu_ms":
			t.CPUMs, err = s.int()
		case "mem_peak":
			t.MemPeak, err = s.int()
		case "device_peak":
			t.DevPeak, err = s.int()
		case "token":
			t.Token, err = s.string()
		case "held":
			t.Held, err = s.bool()
		case "from":
			t.From, err = s.uint()
		case "source":
			t.Source, err = s.shared()
		case "backfill":
			bf := &Backfill{}
			err = s.object(func(key string) error {
				if s.peek() == 'n' {
					unsure = true
					return s.literal("null")
				}
				var err error
				switch key {
				case "ends_by":
					bf.EndsBy, err = s.int()
				case "before":
					bf.Before, err = s.string()
				case "before_start":
					bf.BeforeStart, err = s.int()
				case "beside":
					bf.Beside, err = s.bool()
				default:
					unsure = unsure || mightFoldInto(key, []string{"ends_by", "before", "before_start", "beside"})
					err = s.skip()
				}
				return err
			})
			t.Backfill = bf
		default:
			unsure = unsure || mightFoldInto(key, taskKeys)
			err = s.skip()
		}
		return err
	})
	return unsure, err
}

func (s *scanner) uints() ([]uint64, error) { return arrayOf(s, s.uint) }

// mightFoldInto tells whether encoding/json could take key for one of
// keys.
func mightFoldInto(key string, keys []string) bool {
	for i := 0; i < len(key); i++ {
		if key[i] >= utf8.RuneSelf {
			return true
		}
	}
	for _, k := range keys {
		if strings.EqualFold(key, k) {
			return true
		}
	}
	return false
}

// shared reads a string as string does, but gives the same string for
// the same text without escapes, up to a few hundred of them: the tasks
// of a page mostly share their user, state, directory and log, and a
// listing of thousands of tasks made each anew.
func (s *scanner) shared() (string, error) {
	if s.peek() != '"' {
		return s.string()
	}
	end := s.i + 1
	for end < len(s.b) && s.b[end] != '"' && s.b[end] != '\\' && s.b[end] >= 0x20 && s.b[end] < utf8.RuneSelf {
		end++
	}
	if end >= len(s.b) || s.b[end] != '"' {
		return s.string() // escapes, non-ASCII, or malformed: read the long way
	}
	text := s.b[s.i+1 : end]
	v, ok := s.seen[string(text)]
	if !ok {
		v = string(text)
		if s.seen == nil {
			s.seen = map[string]string{}
		}
		if len(s.seen) < maxShared {
			s.seen[v] = v
		}
	}
	s.i = end + 1
	return v, nil
}

// maxShared bounds the strings a scanner keeps for shared.
const maxShared = 256
