package container

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestDetect(t *testing.T) {
	for argv0, want := range map[string]Engine{
		"docker": Docker, "/usr/bin/docker": Docker, "podman": Podman, "/opt/x/podman": Podman,
		"python": "", "dockerd": "", "": "",
	} {
		if got := Detect([]string{argv0, "run"}); got != want {
			t.Errorf("Detect(%q) = %q, want %q", argv0, got, want)
		}
	}
	if Detect(nil) != "" {
		t.Error("Detect(nil) names an engine")
	}
}

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name   string
		engine Engine
		argv   string
		at     int    // index of "run"
		image  string // the word at Image
		check  func(r *Run) bool
	}{
		{"plain", Docker, "docker run img true", 1, "img", nil},
		{"globals with values", Docker, "docker -H unix:///x.sock --config /c -D run --rm img", 6, "img", nil},
		{"global with =", Docker, "docker --host=unix:///x run img", 2, "img", nil},
		{"container run", Docker, "docker container run -it img sh", 2, "img", nil},
		{"values skipped", Docker, "docker run -e A=1 --name n -v /a:/b --env=B=2 img run --rm", 1, "img",
			func(r *Run) bool { return r.Name == "n" && !r.Detach }},
		{"detach short grouped", Docker, "docker run -dit img", 1, "img", func(r *Run) bool { return r.Detach }},
		{"detach long", Docker, "docker run --detach img", 1, "img", func(r *Run) bool { return r.Detach }},
		{"detach false", Docker, "docker run --detach=false img", 1, "img", func(r *Run) bool { return !r.Detach }},
		{"short value ends the group", Docker, "docker run -ed=1 img", 1, "img", func(r *Run) bool { return !r.Detach }},
		{"short value in the next word", Docker, "docker run -ite X=1 img", 1, "img", nil},
		{"runtime", Docker, "docker run --runtime runc img", 1, "img", func(r *Run) bool { return r.Runtime == "runc" }},
		{"restart", Docker, "docker run --restart=on-failure:3 img", 1, "img",
			func(r *Run) bool { return r.Restart == "on-failure:3" && r.Restarts() }},
		{"restart no", Docker, "docker run --restart no img", 1, "img", func(r *Run) bool { return !r.Restarts() }},
		{"privileged", Docker, "docker run --privileged img", 1, "img", func(r *Run) bool { return r.Privileged }},
		{"devices", Docker, "docker run --device /dev/davinci3 --device=/x/davinci1:/dev/davinci1:rw img", 1, "img",
			func(r *Run) bool { return reflect.DeepEqual(r.Devices, []string{"/dev/davinci3", "/x/davinci1"}) }},
		{"options after the image are the command's", Docker, "docker run img --privileged -d", 1, "img",
			func(r *Run) bool { return !r.Privileged && !r.Detach }},
		{"double dash", Docker, "docker run --rm -- img", 1, "img", nil},
		{"podman globals", Podman, "podman --root /r --runroot /rr --log-level=debug run --preserve-fds 2 img", 6, "img",
			func(r *Run) bool { return r.PreserveFDs }},
		{"podman runtime is global", Podman, "podman --runtime /x/crun run img", 3, "img", func(r *Run) bool { return r.Runtime == "" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			argv := strings.Fields(tc.argv)
			r, err := Parse(tc.engine, argv)
			if err != nil {
				t.Fatalf("Parse(%q): %v", tc.argv, err)
			}
			if r.At != tc.at || argv[r.At] != "run" {
				t.Errorf("run at %d, want %d", r.At, tc.at)
			}
			if r.Image >= len(argv) || argv[r.Image] != tc.image {
				t.Errorf("image at %d (%q), want %q", r.Image, argv[min(r.Image, len(argv)-1)], tc.image)
			}
			if tc.check != nil && !tc.check(r) {
				t.Errorf("Parse(%q) = %+v", tc.argv, r)
			}
		})
	}
}

func TestParseNotRun(t *testing.T) {
	for _, argv := range []string{"docker ps", "docker", "docker -H x", "docker exec c sh", "docker container ls", "podman --root /r start c", "docker -- run img"} {
		_, err := Parse(Docker, strings.Fields(argv))
		if !errors.Is(err, ErrNotRun) {
			t.Errorf("Parse(%q) = %v, want ErrNotRun", argv, err)
		}
	}
	if _, err := Parse(Docker, strings.Fields("docker run --rm")); err == nil || errors.Is(err, ErrNotRun) {
		t.Errorf("a run without an image: %v, want an error of its own", err)
	}
}

func TestWith(t *testing.T) {
	r, err := Parse(Docker, strings.Fields("docker -H h container run --rm img sh -c x"))
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(r.With([]string{"--device=/a:/dev/a", "--env=X=1"}), " ")
	want := "docker -H h container run --device=/a:/dev/a --env=X=1 --rm img sh -c x"
	if got != want {
		t.Errorf("With = %q, want %q", got, want)
	}
}
