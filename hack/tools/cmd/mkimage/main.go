// Command mkimage builds a single-layer container image without a registry or a
// container engine and writes it as a tar that `ctr images import` understands.
//
// The layer is assembled from an optional root filesystem directory, a static
// busybox with applet links, and a list of files (by default copied into /usr/bin):
//
//	mkimage -ref gdd.local/pause:v1 -o pause.tar -file bin/pause:/pause -entrypoint /pause
//	mkimage -ref gdd.local/demo:v1 -o demo.tar -busybox /bin/busybox -cmd sh
//	mkimage -ref gdd.local/gpu-dra-driver:dev -o driver.tar bin/gpu-kubelet-plugin bin/gpu-webhook
//
// The default output is an OCI image layout tar whose index carries the annotations
// io.containerd.image.name=<ref> and org.opencontainers.image.ref.name=<tag>;
// -format docker writes a `docker save` style tar instead.
package main

import (
	"flag"
	"fmt"
	"log"
	"os"
	"path"
	"runtime"
	"strings"
)

type config struct {
	ref        string
	out        string
	format     string
	rootfs     string
	files      []string
	busybox    string
	applets    []string
	entrypoint []string
	cmd        []string
	env        []string
	workdir    string
	arch       string
}

// defaultApplets are the busybox applets linked into /bin when -busybox is given.
const defaultApplets = "sh,ls,cat,env,sleep,echo,mkdir,rm,cp,mv,ln,ps,id,hostname,mount,grep,wc,head,tail,true,false,test,nc,uname,date,stat,find,sed,awk,vi,du,df,nproc,printenv,which,kill,ip,nslookup,wget"

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	var cfg config
	var files, env listFlag
	var applets, entrypoint, cmd string
	flag.StringVar(&cfg.ref, "ref", "", "Image reference to record in the tar, e.g. gdd.local/demo:v1 (required).")
	flag.StringVar(&cfg.out, "o", "", "Output tar file (required).")
	flag.StringVar(&cfg.format, "format", "oci", "Tar format: oci (OCI image layout) or docker (docker save).")
	flag.StringVar(&cfg.rootfs, "rootfs", "", "Directory copied as the image root filesystem.")
	flag.Var(&files, "file", "SRC[:DEST] file to add; DEST defaults to /usr/bin/<base of SRC>. Repeatable; positional arguments are the same.")
	flag.StringVar(&cfg.busybox, "busybox", "", "Static busybox binary installed as /bin/busybox with applet links.")
	flag.StringVar(&applets, "applets", defaultApplets, "Comma-separated busybox applets to link into /bin.")
	flag.StringVar(&entrypoint, "entrypoint", "", "Entrypoint, split on whitespace.")
	flag.StringVar(&cmd, "cmd", "", "Default command, split on whitespace.")
	flag.Var(&env, "env", "KEY=VALUE environment entry. Repeatable; PATH has a default.")
	flag.StringVar(&cfg.workdir, "workdir", "/", "Working directory.")
	flag.StringVar(&cfg.arch, "arch", runtime.GOARCH, "Image architecture.")
	flag.Parse()

	cfg.files = append(files, flag.Args()...)
	cfg.env = env
	cfg.applets = splitList(applets)
	cfg.entrypoint = strings.Fields(entrypoint)
	cfg.cmd = strings.Fields(cmd)
	if err := run(cfg); err != nil {
		log.Fatalf("mkimage: %v", err)
	}
}

func run(cfg config) error {
	if cfg.ref == "" || cfg.out == "" {
		return fmt.Errorf("-ref and -o are required")
	}
	if cfg.format != "oci" && cfg.format != "docker" {
		return fmt.Errorf("-format %q: must be oci or docker", cfg.format)
	}
	fs := newTree()
	if cfg.rootfs != "" {
		if err := fs.addDir(cfg.rootfs, "/"); err != nil {
			return err
		}
	}
	if cfg.busybox != "" {
		if err := fs.addFile(cfg.busybox, "/bin/busybox", 0o755); err != nil {
			return err
		}
		for _, a := range cfg.applets {
			fs.addSymlink("/bin/"+a, "busybox")
		}
	}
	for _, f := range cfg.files {
		src, dest, ok := strings.Cut(f, ":")
		if !ok {
			dest = path.Join("/usr/bin", path.Base(src))
		}
		if err := fs.addFile(src, dest, 0o755); err != nil {
			return err
		}
	}
	fs.ensureDir("/tmp", 0o1777)
	fs.ensureDir("/etc", 0o755)

	layer, err := fs.tar()
	if err != nil {
		return fmt.Errorf("build layer: %w", err)
	}
	img, err := newImage(layer, cfg)
	if err != nil {
		return err
	}
	if err := writeImage(cfg.out, cfg.ref, cfg.format, img); err != nil {
		return fmt.Errorf("write %s: %w", cfg.out, err)
	}
	d, _ := img.Digest()
	log.Printf("wrote %s (%s, %d bytes of layer, manifest %s)", cfg.out, cfg.ref, len(layer), d)
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}

func init() {
	log.SetFlags(0)
	flag.CommandLine.SetOutput(os.Stderr)
}
